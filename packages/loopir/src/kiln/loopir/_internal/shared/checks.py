"""The run-time check/status protocol of generated kernels.

Eager raises on an out-of-range index (IndexError) and on an integer division or remainder by
zero (RuntimeError "ZeroDivisionError"). Generated code cannot raise. So a kernel with such
checks takes one more argument, a 32-bit status: where a check fails the kernel stores its
number (1-based, ``checks[k]`` is number k + 1) there, keeps going on clamped, safe values, and
the runtime turns a nonzero status back into the exception eager would raise, naming the kernel
and the buffer (`raise_failed_check`). How the number reaches the status is the target's: a
max-reduction over loop iterations in C++, a masked store in Triton.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sympy

from .host import evaluate_size


@dataclasses.dataclass(frozen=True, slots=True)
class CheckSite:
    """One check in a kernel; `message` may hold ``{size}``, the expression `size` evaluated
    with the call's size symbols."""

    error: type[Exception]
    message: str
    size: sympy.Expr | None = None


def raise_failed_check(kernel_name: str, symbols: Sequence[sympy.Symbol], sites: Sequence[CheckSite],
                       status: int, sizes: Sequence[int]) -> None:
    """Raise the error of check number `status` (1-based) of a kernel called with `sizes`."""
    if not 1 <= status <= len(sites):
        raise RuntimeError(f"{kernel_name}: reported run-time check {status}, but it has {len(sites)} checks; "
                           "the kernel wrote a corrupt status")
    site = sites[status - 1]
    size = None if site.size is None else evaluate_size(site.size, dict(zip(symbols, sizes)))
    raise site.error(f"{kernel_name}: {site.message.format(size=size)}")
