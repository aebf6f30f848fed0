"""Orthogonal polynomials of a degree n given as a number: Chebyshev T/U/V/W (plain and
shifted), Hermite H/He, Laguerre L and Legendre P (the `n_scalar` overloads).

Each follows aten's Math.h: the special values at the ends of the interval, the closed form
cos(n acos x) (and its U/V/W kin) inside it for larger n, else the three-term recurrence, here
unrolled n times, which a known n allows. A degree given as a tensor (the default overloads) is
not lowered: eager runs the recurrence n times for each element's own n, which no fixed number
of unrolled steps bounds, so those ops stay out of loopir's region.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .lower_special_math import Real, float_dtype, select, special_pointwise, where
from .registry import Lowerings

aten = torch.ops.aten
TABLE = Lowerings()

MAX_DEGREE = 512  # unrolled recurrence steps at most (Hermite's own limit in float64)
HERMITE_LIMIT = {torch.float32: 128, torch.float64: 512}  # Math.h: NaN beyond (by the input's dtype)


def _recurrence(first: Real, twice: Real, n: int) -> Real:
    """q_n of q_0 = 1, q_1 = `first`, q_k = `twice` q_(k-1) - q_(k-2) (the Chebyshev recurrences)."""
    p, q = first.const(1.0), first
    for _ in range(2, n + 1):
        p, q = q, twice * q - p
    return q


def _low_degree(first: Real, twice: Real, n: int) -> Real:
    return first.const(1.0) if n == 0 else _recurrence(first, twice, n)


def _signed(even: bool, value: float) -> float:
    return value if even else -value


def chebyshev_t(x: Real, n: int) -> Real:
    end = x.const(1.0) if n % 2 == 0 else where(x > 0.0, 1.0, x.const(-1.0))
    value = _low_degree(x, x + x, n)
    if n > 6:
        value = where(x.abs() < 1.0, (float(n) * x.apply("acos")).apply("cos"), value)
    return where(x.abs().eq(1.0), end, value)


def _u_closed_form(t: Real, n: int) -> Real:
    angle = t.apply("acos")
    sin = angle.apply("sin")
    return where(sin.ne(0.0), (float(n + 1) * angle).apply("sin") / sin,
                 float(n + 1) * (float(n + 1) * angle).apply("cos") / t)


def chebyshev_u(x: Real, n: int) -> Real:
    end = where(x > 0.0, float(n + 1), x.const(_signed(n % 2 == 0, n + 1.0)))
    value = _low_degree(x + x, x + x, n)
    if n > 8:
        value = where(x.abs() < 1.0, _u_closed_form(x, n), value)
    return where(x.abs().eq(1.0), end, value)


def _v_closed_form(t: Real, n: int, at_pole: Real | float) -> Real:
    angle = t.apply("acos")
    half = angle / 2.0
    # Math.h tests sin(angle / 2) here, as written
    return where(half.apply("sin").ne(1.0), ((n + 0.5) * angle).apply("cos") / half.apply("cos"), at_pole)


def _w_closed_form(t: Real, n: int, at_pole: Real | float) -> Real:
    angle = t.apply("acos")
    half = angle / 2.0
    return where(half.apply("cos").ne(1.0), ((n + 0.5) * angle).apply("sin") / half.apply("sin"), at_pole)


def chebyshev_v(x: Real, n: int) -> Real:
    odd_end = _signed(n % 2 == 0, 2.0 * n + 1.0)
    end = where(x > 0.0, x.const(1.0), odd_end)
    value = _low_degree(x + x - 1.0, x + x, n)
    if n > 8:
        value = where(x.abs() < 1.0, _v_closed_form(x, n, x.const(odd_end)), value)
    return where(x.abs().eq(1.0), end, value)


def chebyshev_w(x: Real, n: int) -> Real:
    end = where(x > 0.0, x.const(2.0 * n + 1.0), _signed(n % 2 == 0, 1.0))
    value = _low_degree(x + x + 1.0, x + x, n)
    if n > 8:
        value = where(x.abs() < 1.0, _w_closed_form(x, n, end), value)
    return where(x.abs().eq(1.0), end, value)


def _shifted(x: Real, at_one: float, at_zero: float, value: Real) -> Real:
    return select(value, (x.eq(1.0), at_one), (x.eq(0.0), at_zero))


def shifted_chebyshev_t(x: Real, n: int) -> Real:
    t = x + x - 1.0
    value = _low_degree(t, t + t, n)
    if n > 6:
        value = where(t.abs() < 1.0, (float(n) * t.apply("acos")).apply("cos"), value)
    return _shifted(x, 1.0, _signed(n % 2 == 0, 1.0), value)


def shifted_chebyshev_u(x: Real, n: int) -> Real:
    t = x + x - 1.0
    value = _low_degree(t + t, t + t, n)
    if n > 6:
        value = where(t.abs() < 1.0, _u_closed_form(t, n), value)
    return _shifted(x, n + 1.0, _signed(n % 2 == 0, n + 1.0), value)


def shifted_chebyshev_v(x: Real, n: int) -> Real:
    t = x + x - 1.0
    at_zero = _signed(n % 2 == 0, 2.0 * n + 1.0)
    value = _low_degree(t + t - 1.0, t + t, n)
    if n > 6:
        value = where(t.abs() < 1.0, _v_closed_form(t, n, at_zero), value)
    return _shifted(x, 1.0, at_zero, value)


def shifted_chebyshev_w(x: Real, n: int) -> Real:
    t = x + x - 1.0
    at_zero = _signed(n % 2 == 0, 1.0)
    value = _low_degree(t + t + 1.0, t + t, n)
    if n > 4:
        value = where(t.abs() < 1.0, _w_closed_form(t, n, at_zero), value)
    return _shifted(x, 2.0 * n + 1.0, at_zero, value)


def hermite_h(x: Real, n: int) -> Real:
    if n == 0:
        return x.const(1.0)
    p, q = x.const(1.0), x + x
    for k in range(2, n + n, 2):
        p, q = q, (x + x) * q - float(k) * p
    return q


def hermite_he(x: Real, n: int) -> Real:
    if n == 0:
        return x.const(1.0)
    p, q = x.const(1.0), x
    for k in range(1, n):
        p, q = q, x * q - float(k) * p
    return q


def laguerre_l(x: Real, n: int) -> Real:
    if n == 0:
        return x.const(1.0)
    p, q = x.const(1.0), 1.0 - x
    for k in range(1, n):
        p, q = q, ((float(k + k) + (1.0 - x)) * q - float(k) * p) / float(k + 1)
    return where(x.abs().eq(0.0), 1.0, q)


def legendre_p(x: Real, n: int) -> Real:
    end = x.const(1.0) if n % 2 == 0 else where(x > 0.0, 1.0, x.const(-1.0))
    if n == 0:
        return x.const(1.0)
    p, q = x.const(1.0), x
    for k in range(1, n):
        p, q = q, (float(k + k + 1) * x * q - float(k) * p) / float(k + 1)
    return where(x.abs().eq(1.0), end, q)


POLYNOMIALS: dict[str, Callable[[Real, int], Real]] = {
    "chebyshev_polynomial_t": chebyshev_t, "chebyshev_polynomial_u": chebyshev_u,
    "chebyshev_polynomial_v": chebyshev_v, "chebyshev_polynomial_w": chebyshev_w,
    "shifted_chebyshev_polynomial_t": shifted_chebyshev_t, "shifted_chebyshev_polynomial_u": shifted_chebyshev_u,
    "shifted_chebyshev_polynomial_v": shifted_chebyshev_v, "shifted_chebyshev_polynomial_w": shifted_chebyshev_w,
    "hermite_polynomial_h": hermite_h, "hermite_polynomial_he": hermite_he,
    "laguerre_polynomial_l": laguerre_l, "legendre_polynomial_p": legendre_p,
}


def _degree(node, n) -> int:
    """The degree as eager takes it: the number converted to an int64 (truncated; True is 1)."""
    if not isinstance(n, (int, float)) or not math.isfinite(n):
        raise NotImplementedError(f"{node.target} of degree {n!r} is not lowered (a finite number only)")
    return int(n)


def _lowering(fn: Callable[[Real, int], Real]):
    def lower(ctx, node, x, n):
        degree = _degree(node, n)
        limit = HERMITE_LIMIT.get(float_dtype(node), 0) if fn in (hermite_h, hermite_he) else None
        if degree < 0 or (limit is not None and degree > limit):
            value = 0.0 if degree < 0 else math.nan
            return special_pointwise(node, lambda x: x.const(value), x)
        if degree > MAX_DEGREE:
            raise NotImplementedError(f"{node.target} of degree {degree} is not lowered: its recurrence would be "
                                      f"unrolled {degree} times (at most {MAX_DEGREE})")

        def polynomial(value: Real) -> Real:
            # float32 runs the recurrence in float64 too: its rounding errors grow with the degree
            # where terms cancel, and eager's compiled loop contracts them into fused multiply-adds
            # (rounded once), which a float32 loop body would not reproduce
            return fn(value.to(torch.float64), degree).to(value.dtype)

        return special_pointwise(node, polynomial, x)

    lower.__name__ = f"lower_{fn.__name__}"
    return lower


for _name, _fn in POLYNOMIALS.items():
    TABLE.register("pointwise", getattr(aten, f"special_{_name}").n_scalar)(_lowering(_fn))
