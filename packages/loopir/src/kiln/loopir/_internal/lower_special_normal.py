"""Functions of the normal distribution as loop bodies: ndtri (the inverse of its CDF), the
scaled complementary error function erfcx, and log_ndtr (the log of its CDF).

ndtri follows aten's Math.h (Cephes' rational approximations), in the result's dtype. erfcx
does not: Math.h evaluates it with a table of 100 Chebyshev polynomials chosen by a switch on
the argument, which a loop body cannot index. Here, in float64 (then rounded to the result's
dtype):

* x < 10: exp(x**2) erfc(x), with libm's erfc; the rounding of x**2 costs about x**2 ulps
  (below 1e-14 relative); for x < 0 it is eager's own formula (2 exp(x**2) - erfcx(-x)), x**2
  rounded to the input's dtype as eager rounds it;
* x >= 10: the continued fraction 1 / sqrt(pi) / (x + 1/2 / (x + 2/2 / (x + 3/2 / ...)))
  that Math.h uses above 50, with 8 terms (a truncation error below 5e-16 from x = 10 on).

This file's ndtri is derived from the implementation of ndtri in the Cephes Math Library, as
aten's Math.h carries it. See note [3-Clause BSD License for the Cephes Math Library] there.
"""

from __future__ import annotations

import torch

from .lower_special_math import Real, polevl, select, special_pointwise, where
from .registry import Lowerings

aten = torch.ops.aten
TABLE = Lowerings()

SQRT_2PI = 2.5066282746310007
SQRT1_2 = 0.7071067811865476  # 1 / sqrt(2)
SQRT1_PI = 0.5641895835477563  # 1 / sqrt(pi)
EXP_M2 = 0.1353352832366127  # exp(-2)
# approximation for 0 <= |y - 0.5| <= 3/8
NDTRI_P0 = (-59.96335010141079, 98.00107541859997, -56.67628574690703, 13.931260938727968, -1.2391658386738125)
NDTRI_Q0 = (1.0, 1.9544885833814176, 4.676279128988815, 86.36024213908905, -225.46268785411937,
            200.26021238006066, -82.03722561683334, 15.90562251262117, -1.1833162112133)
# for z = sqrt(-2 log y) between 2 and 8, i.e. y between exp(-2) and exp(-32)
NDTRI_P1 = (4.0554489230596245, 31.525109459989388, 57.16281922464213, 44.08050738932008, 14.684956192885803,
            2.1866330685079025, -0.1402560791713545, -0.03504246268278482, -0.0008574567851546854)
NDTRI_Q1 = (1.0, 15.779988325646675, 45.39076351288792, 41.3172038254672, 15.04253856929075, 2.504649462083094,
            -0.14218292285478779, -0.03808064076915783, -0.0009332594808954574)
# for z between 8 and 64, i.e. y between exp(-32) and exp(-2048)
NDTRI_P2 = (3.2377489177694603, 6.915228890689842, 3.9388102529247444, 1.3330346081580755, 0.20148538954917908,
            0.012371663481782003, 0.00030158155350823543, 2.6580697468673755e-06, 6.239745391849833e-09)
NDTRI_Q2 = (1.0, 6.02427039364742, 3.6798356385616087, 1.3770209948908132, 0.21623699359449663,
            0.013420400608854318, 0.00032801446468212774, 2.8924786474538068e-06, 6.790194080099813e-09)
ERFCX_FRACTION_TERMS = 8


def ndtri(y0: Real) -> Real:
    upper = y0 > 1.0 - EXP_M2  # the upper tail is computed as the lower tail of 1 - y
    y = where(upper, 1.0 - y0, y0)
    centered = y - 0.5
    c2 = centered * centered
    central = (centered + centered * (c2 * polevl(c2, NDTRI_P0) / polevl(c2, NDTRI_Q0))) * SQRT_2PI
    x = (-2.0 * y.log()).sqrt()
    x0 = x - x.log() / x
    z = 1.0 / x
    x1 = where(x < 8.0, z * polevl(z, NDTRI_P1) / polevl(z, NDTRI_Q1), z * polevl(z, NDTRI_P2) / polevl(z, NDTRI_Q2))
    tail = x0 - x1
    value = where(y > EXP_M2, central, where(upper, tail, -tail))
    return select(value, (y0.eq(0.0), float("-inf")), (y0.eq(1.0), float("inf")),
                  ((y0 < 0.0) | (y0 > 1.0), float("nan")))


def erfcx(z: Real) -> Real:
    """erfcx in float64 (see the module docstring), returned in `z`'s dtype."""
    x = z.to(torch.float64)
    # eager squares a negative x in its own dtype (2 exp(x * x) - ...): in float32 that rounding
    # is its largest error (about x**2 ulps), which a float64 square would not share
    square = where(x < 0.0, (z * z).to(torch.float64), x * x)
    direct = square.exp() * x.apply("erfc")
    t = x
    for k in range(ERFCX_FRACTION_TERMS, 0, -1):
        t = x + (k / 2.0) / t
    fraction = SQRT1_PI / t
    return where(x >= 10.0, fraction, direct).to(z.dtype)


def log_ndtr(x: Real) -> Real:
    t = x * SQRT1_2
    return where(x < -1.0, (erfcx(-t) / 2.0).log() - t * t, (-(t.apply("erfc")) / 2.0).apply("log1p"))


@TABLE.register("pointwise", aten.special_ndtri.default)
def lower_ndtri(ctx, node, x):
    return special_pointwise(node, ndtri, x)


@TABLE.register("pointwise", aten.special_erfcx.default)
def lower_erfcx(ctx, node, x):
    return special_pointwise(node, erfcx, x)


@TABLE.register("pointwise", aten.special_log_ndtr.default)
def lower_log_ndtr(ctx, node, x):
    return special_pointwise(node, log_ndtr, x)
