"""Run-time checks in generated kernels: what each one reports, and raising it in Python.

Eager raises on an out-of-range index (IndexError) and on an integer division or remainder by
zero (RuntimeError "ZeroDivisionError"). Generated code cannot raise, so each kernel that has
such a check takes one more parameter, ``int32_t* kiln_status``: the loops fold every check
into a local ``kiln_fail`` (a max-reduction, so OpenMP and simd loops stay race-free and
vectorizable) holding the number of the failed check, 0 when all passed, and store it there
once after the loops. The work done meanwhile is safe: an out-of-range index is clamped
before it is used, and a zero divisor is never divided by. `raise_failed_check` turns the
number back into the exception eager would raise, naming the kernel and buffer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sympy

from .printer import python_expr


@dataclasses.dataclass(frozen=True, slots=True)
class CheckSite:
    """One check in a kernel; `message` may hold ``{size}``, `size` evaluated at the call."""

    error: type[Exception]
    message: str
    size: sympy.Expr | None = None


def raise_failed_check(kernel_name: str, symbols: Sequence[sympy.Symbol], sites: Sequence[CheckSite],
                       status: int, sizes: Sequence[int]) -> None:
    """Raise the error of check number `status` (1-based) of a kernel called with `sizes`."""
    site = sites[status - 1]
    size = None
    if site.size is not None:
        size = eval(python_expr(site.size), {"max": max, "min": min},  # noqa: S307 (our printed expr)
                    {s.name: v for s, v in zip(symbols, sizes)})
    raise site.error(f"{kernel_name}: {site.message.format(size=size)}")
