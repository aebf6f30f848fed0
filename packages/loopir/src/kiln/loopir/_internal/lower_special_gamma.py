"""The gamma-function family as loop bodies: digamma, polygamma (trigamma for n = 1, the
Hurwitz zeta function for n >= 2) and special_zeta.

Each follows aten's Math.h (Cephes' digamma and zeta, its trigamma), with its constants and
order of operations. Its loops become a fixed number of unrolled steps:

* digamma's recurrence ``while x < 10: result -= 1 / x; x += 1`` runs at most 10 times for
  x > 0 (9 after the reflection of a negative x), so 10 steps, each predicated on ``x < 10``;
* zeta's direct sum runs at most 10 times for q > 0, and its Euler-Maclaurin tail 12 times;
  both stop once a term is below the machine epsilon, which the unrolled steps follow with a
  `done` flag that freezes the sum. For q < 0 (where eager sums about -q terms) the sum is
  split into three sums at positive arguments (below), so the steps stay bounded.

zeta is computed in float64 for float32 inputs too, as eager's CPU kernel does (its
accumulation type). This file is derived from the implementations of digamma and zeta in the
Cephes Math Library, as aten's Math.h carries them. See note [3-Clause BSD License for the
Cephes Math Library] there.
"""

from __future__ import annotations

import math

import torch

from .lower_special_math import Cond, Real, never, polevl, select, special_pointwise, where
from .registry import Lowerings

aten = torch.ops.aten
TABLE = Lowerings()

INF, NAN = float("inf"), float("nan")
PSI_10 = 2.251752589066721  # digamma(10)
DIGAMMA_A = (0.08333333333333333, -0.021092796092796094, 0.007575757575757576, -0.004166666666666667,
             0.003968253968253968, -0.008333333333333333, 0.08333333333333333)
MACHEP = 1.1102230246251565e-16
# Euler-Maclaurin coefficients: (2k)! / B_2k
ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1892437580.3183792, 74724249600.0, -2950130727918.164,
          116467828143500.67, -4597978722407473.0, 1.8152105401943546e+17, -7.166165256175667e+18)


def _is_integer(x: Real) -> Cond:
    return x.eq(x.apply("trunc"))


def digamma(x: Real) -> Real:
    negative = x < 0.0
    y = where(negative, 1.0 - x, x)  # digamma(x) = digamma(1 - x) - pi / tan(pi x) for x < 0
    result = x.const(0.0)
    for _ in range(10):
        below = y < 10.0
        result = where(below, result - 1.0 / y, result)
        y = where(below, y + 1.0, y)
    z = 1.0 / (y * y)
    tail = where(y < 1e17, z * polevl(z, DIGAMMA_A), 0.0)
    positive = where(y.eq(10.0), result + PSI_10, result + y.log() - 0.5 / y - tail)
    # pi / tan(pi r) of x's fractional part r, in float64 (more accurate than of pi x), as eager
    wide = x.to(torch.float64)
    fraction = wide - wide.apply("trunc")
    reflection = (math.pi / (math.pi * fraction).apply("tan")).to(x.dtype)
    value = where(negative, positive - reflection, positive)
    return select(value, (x.eq(0.0), x.const(INF).copysign(-x)), (negative & _is_integer(x), NAN))


def trigamma(x: Real) -> Real:
    reflect = x < 0.5  # trigamma(x) = -trigamma(1 - x) + pi**2 / sin(pi x)**2
    pi = x.const(math.pi)
    sin_pi_x = (pi * x).apply("sin")
    result = where(reflect, 0.0 - pi * pi / (sin_pi_x * sin_pi_x), 0.0)
    y = where(reflect, 1.0 - x, x)
    for _ in range(6):
        result = result + 1.0 / (y * y)
        y = y + 1.0
    ixx = 1.0 / (y * y)
    result = result + (1.0 + 1.0 / (2.0 * y) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / y
    return where(reflect, -result, result)


def _zeta_positive(x: Real, q: Real) -> Real:
    """Math.h's zeta(x, q) for q > 0 (x > 1): a direct sum of up to 10 terms (more only while
    q + i <= 9), then the Euler-Maclaurin tail; each stops at a term below the epsilon."""
    done = never(x)
    s, a, b = q.pow(-x), q, x.const(0.0)
    for i in range(10):
        # `while (i < 9 || a <= 9)`: a 10th term only where q + 9 rounds to 9 (a tiny q)
        active = ~done if i < 9 else ~done & (a <= 9.0)
        a_next = a + 1.0
        b_next = a_next.pow(-x)
        s_next = s + b_next
        converged = (-MACHEP * s_next < b_next) & (b_next < MACHEP * s_next)
        a, b, s = where(active, a_next, a), where(active, b_next, b), where(active, s_next, s)
        done = done | (active & converged)
    w = a
    s = where(done, s, s + b * w / (x - 1.0) - 0.5 * b)
    a = x.const(1.0)
    k = 0.0
    for coefficient in ZETA_A:
        a = a * (x + k)
        b = b / w
        t = a * b / coefficient
        s_next = s + t
        s = where(done, s, s_next)
        done = done | ((t / s_next).abs() < MACHEP)
        a = a * (x + (k + 1.0))
        b = b / w
        k += 2.0
    return s


def hurwitz_zeta(x: Real, q: Real) -> Real:
    """Math.h's zeta(x, q), in `x`'s dtype.

    For q < 0 (then x must be an integer), eager sums the -q terms below 0 directly. Here, with
    q = f - M (0 < f < 1, M a positive integer), the terms below 0 are (-1)**x times the terms
    of zeta(x, 1 - f) that zeta(x, 1 - q) lacks, and the rest is zeta(x, f):
    zeta(x, q) = zeta(x, f) + (-1)**x (zeta(x, 1 - f) - zeta(x, 1 - q)), three sums at positive
    arguments."""
    negative = q < 0.0
    floor = q.apply("floor")
    fraction = q - floor
    main = _zeta_positive(x, where(negative, fraction, q))
    # 1 - f as ceil(q) - q: exact, where 1 - f loses a tiny |q| to rounding
    mirrored, beyond = _zeta_positive(x, q.apply("ceil") - q), _zeta_positive(x, 1.0 - q)
    even = (x - 2.0 * (x / 2.0).apply("floor")).eq(0.0)
    # the two sums near the pole first: for odd x their terms cancel (exactly for f = 1/2)
    reflected = where(even, main + mirrored - beyond, main - mirrored + beyond)
    # x = inf: the term in (0, 1) is infinite (eager's sum), the split would give inf - inf
    value = where(negative, where(x.isinf(), INF, reflected), main)
    pole = q <= 0.0
    return select(value, (x.eq(1.0), INF), (x < 1.0, NAN), (pole & q.eq(floor), INF),
                  (pole & x.ne(x.apply("floor")), NAN))


def zeta(x: Real, q: Real) -> Real:
    """special_zeta: computed in float64 (eager's CPU accumulation type), returned in `x`'s dtype."""
    return hurwitz_zeta(x.to(torch.float64), q.to(torch.float64)).to(x.dtype)


def polygamma(n: int, x: Real) -> Real:
    """The n-th derivative of digamma: digamma, trigamma, else (-1)**(n+1) n! zeta(n + 1, x)."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    order = x.const(float(n + 1)).to(torch.float64)
    factor = (1.0 if n % 2 else -1.0) * float(math.factorial(n))
    return factor * hurwitz_zeta(order, x.to(torch.float64)).to(x.dtype)


@TABLE.register("pointwise", aten.digamma.default)
def lower_digamma(ctx, node, x):
    return special_pointwise(node, digamma, x)


@TABLE.register("pointwise", aten.polygamma.default)
def lower_polygamma(ctx, node, n, x):
    if not isinstance(n, int) or n < 0:
        raise NotImplementedError(f"polygamma of order {n!r} is not lowered (a non-negative int order only)")
    return special_pointwise(node, lambda value: polygamma(n, value), x)


@TABLE.register("pointwise", aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar)
def lower_zeta(ctx, node, x, q):
    return special_pointwise(node, zeta, x, q)
