"""C++ for loopir's `Scan` nodes (cumsum, cumprod, logcumsumexp, cummax/cummin): per point of
the outer loops, a sequential loop along the scanned dim that keeps the running value in a
local declared before it and stores it at every step.

Combination follows torch: sums and products in the scan's dtype, in order (as eager's CPU
kernel); max/min propagate NaN; logaddexp as eager's `_log_add_exp_helper`; cummax/cummin
positions move to the latest element that is as large (small) as the running value, or NaN.
"""

from __future__ import annotations

from .reduction_source import lowest_first

SOURCE = """
// log(exp(a) + exp(b)) as eager's logcumsumexp combines: equal infinities give themselves.
template <typename T> static inline T kiln_logaddexp(T a, T b) {
    if (a != a || b != b) return a + b;
    T lo = std::min(a, b), hi = std::max(a, b);
    if (lo == hi && std::isinf(lo)) return a;
    return hi + std::log1p(std::exp(lo - hi));
}
"""

_COMBINE = {"sum": "{0} + {1}", "prod": "{0} * {1}", "max": "kiln_max({0}, {1})", "min": "kiln_min({0}, {1})",
            "logaddexp": "kiln_logaddexp({0}, {1})"}
_IDENTITY = {"sum": "0", "prod": "1"}


def scan_statements(name: str, scan_type: str, ctype: str, value: str | tuple[str, str]
                    ) -> tuple[list[str], list[str], str]:
    """(declarations before the scan loop, statements in it after `value` is computed, the
    variable holding the running result at this step)."""
    if scan_type in ("argmax", "argmin"):
        element, position = value
        best, at = f"best_{name}", f"at_{name}"
        compare = ">=" if scan_type == "argmax" else "<="
        nan = f" || {element} != {element}" if ctype in ("float", "double") else ""
        declarations = [f"{ctype} {best} = {lowest_first(scan_type, ctype)};", f"int64_t {at} = 0;"]
        update = f"if ({element} {compare} {best}{nan}) {{ {best} = {element}; {at} = {position}; }}"
        return declarations, [update], at
    acc = f"acc_{name}"
    identity = _IDENTITY.get(scan_type) or lowest_first("max" if scan_type in ("max", "logaddexp") else "min", ctype)
    return [f"{ctype} {acc} = {identity};"], [f"{acc} = {_COMBINE[scan_type].format(acc, value)};"], acc


def uses_scan(source: str) -> bool:
    return "kiln_logaddexp(" in source
