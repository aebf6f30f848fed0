"""C++ for loopir's `Scan` nodes (cumsum, cumprod, logcumsumexp, cummax/cummin): per point of
the outer loops, a sequential loop along the scanned dim that keeps the running value (the
scan's *state*) in locals declared before it and stores it at every step. Long scans over few
rows also get a parallel two-pass version (`parallel_scan_source.py`), built on the same state.

Combination follows torch: float32 sums, products and logaddexp accumulate in double, as
eager's CPU kernel does (its `acc_type`; over 10^6 elements a float accumulator drifts by whole
units from eager), other dtypes in their own; in order; max/min propagate NaN; logaddexp as
eager's `_log_add_exp_helper`; cummax/cummin positions move to the latest element that is as
large (small) as the running value, or NaN.
"""

from __future__ import annotations

import dataclasses

from .reduction_source import lowest_first

SOURCE = """
// log(exp(a) + exp(b)) as eager's logcumsumexp combines: equal infinities give themselves.
template <typename T> static inline T kiln_logaddexp(T a, T b) {
    if (a != a || b != b) return a + b;
    T lo = std::min(a, b), hi = std::max(a, b);
    if (lo == hi && std::isinf(lo)) return a;
    return hi + std::log1p(std::exp(lo - hi));
}
#ifdef _OPENMP
#include <omp.h>
#endif
// The threads a parallel region would get (torch's setting: kernels share torch's libgomp).
static inline int64_t kiln_scan_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
"""

_COMBINE = {"sum": "{0} + {1}", "prod": "{0} * {1}", "max": "kiln_max({0}, {1})", "min": "kiln_min({0}, {1})",
            "logaddexp": "kiln_logaddexp({0}, static_cast<{2}>({1}))"}
_IDENTITY = {"sum": "0", "prod": "1"}
_WIDENED = ("sum", "prod", "logaddexp")  # accumulate float32 in double, as eager's acc_type
_OMP_REDUCTION = {"sum": "+", "prod": "*"}  # whose chunk folds an `omp simd reduction` may reorder


@dataclasses.dataclass(frozen=True, slots=True)
class ScanState:
    """The running state of one scan: its variables (`names`, of `ctypes`, starting at
    `initial`, the combination's identity) and how an element, or another state, joins it."""

    name: str
    scan_type: str
    value_ctype: str  # the C++ type of the scanned values (and of the stored result)
    names: tuple[str, ...]
    ctypes: tuple[str, ...]
    initial: tuple[str, ...]

    @property
    def is_position(self) -> bool:
        return self.scan_type in ("argmax", "argmin")

    def declarations(self, initial: tuple[str, ...] | None = None) -> list[str]:
        return [f"{t} {n} = {v};" for t, n, v in zip(self.ctypes, self.names, initial or self.initial)]

    def update(self, value: str | tuple[str, str], into: tuple[str, ...] | None = None) -> list[str]:
        """Statements joining `value` (an element, with its position for cummax/cummin; or the
        state of the elements that follow, in the same form) into the state `into`. Joining a
        later chunk's state is the same statement: the running result after its elements."""
        into = into or self.names
        if self.is_position:
            element, position = value
            best, at = into
            compare = ">=" if self.scan_type == "argmax" else "<="
            nan = f" || {element} != {element}" if self.value_ctype in ("float", "double") else ""
            return [f"if ({element} {compare} {best}{nan}) {{ {best} = {element}; {at} = {position}; }}"]
        (acc,) = into
        return [f"{acc} = {_COMBINE[self.scan_type].format(acc, value, self.ctypes[0])};"]

    @property
    def result(self) -> str:
        """The variable holding the result at this step (of the value's type)."""
        if self.is_position:
            return self.names[1]
        return f"val_{self.name}" if self.ctypes[0] != self.value_ctype else self.names[0]

    def result_lines(self) -> list[str]:
        """The accumulator rounded to the value's type, when it is wider."""
        if self.result == self.names[0] or self.is_position:
            return []
        return [f"{self.value_ctype} {self.result} = static_cast<{self.value_ctype}>({self.names[0]});"]

    @property
    def omp_reduction(self) -> str | None:
        """The `omp simd reduction` operator that may fold a chunk, None: none may."""
        return _OMP_REDUCTION.get(self.scan_type)


def scan_state(name: str, scan_type: str, ctype: str) -> ScanState:
    if scan_type in ("argmax", "argmin"):
        return ScanState(name, scan_type, ctype, (f"best_{name}", f"at_{name}"), (ctype, "int64_t"),
                         (lowest_first(scan_type, ctype), "0"))
    acc_ctype = "double" if ctype == "float" and scan_type in _WIDENED else ctype
    identity = _IDENTITY.get(scan_type) or lowest_first("max" if scan_type in ("max", "logaddexp") else "min",
                                                        acc_ctype)
    return ScanState(name, scan_type, ctype, (f"acc_{name}",), (acc_ctype,), (identity,))


def scan_statements(state: ScanState, value: str | tuple[str, str]) -> list[str]:
    """The statements in the scan's loop after `value` is computed: the update, then the
    result at this step (`state.result`)."""
    return state.update(value) + state.result_lines()


def uses_scan(source: str) -> bool:
    return "kiln_logaddexp(" in source or "kiln_scan_threads(" in source
