"""Bessel functions as loop bodies: i0/i0e/i1/i1e, the modified Bessel functions of the first
and second kind (plain and exponentially scaled), the Bessel functions of the first and second
kind of orders 0 and 1, and the spherical Bessel function j0.

Each follows the function of the same name in aten's Math.h (Cephes' algorithms: Chebyshev
series over [0, 8] or [0, 2] and over the inverted interval beyond; rational approximations
below 5 and Hankel's asymptotic form beyond), with its coefficients and order of operations,
computed in the result's dtype (float32 for bfloat16/float16) as eager does on CPU. Branches
are `where` selections: both sides are computed on every lane.

This file is derived from the implementations of these functions in the Cephes Math Library,
as aten's Math.h carries them. See note [3-Clause BSD License for the Cephes Math Library] there.
"""

from __future__ import annotations

import torch

from .lower_special_math import Real, chbevl, polevl, select, special_pointwise, where
from .registry import Lowerings

aten = torch.ops.aten
TABLE = Lowerings()

PI_4 = 0.7853981633974483  # pi / 4
PI3_4 = 2.356194490192345  # 3 pi / 4
SQRT_2_PI = 0.7978845608028654  # sqrt(2 / pi)
TWO_PI = 0.6366197723675814  # 2 / pi

J0_PP = (
    0.0007969367292973471, 0.08283523921074408, 1.239533716464143, 5.447250030587687, 8.74716500199817,
    5.303240382353949, 1.0,
)
J0_PQ = (
    0.0009244088105588637, 0.08562884743544745, 1.2535274390105895, 5.470977403304171, 8.761908832370695,
    5.306052882353947, 1.0,
)
J0_QP = (
    -0.011366383889846916, -1.2825271867050931, -19.553954425773597, -93.20601521237683, -177.68116798048806,
    -147.07750515495118, -51.41053267665993, -6.050143506007285,
)
J0_QQ = (
    64.3178256118178, 856.4300259769806, 3882.4018360540163, 7240.467741956525, 5930.727011873169,
    2062.0933166032783, 242.0057402402914,
)
J0_RP = (
    -4794432209.782018, 1956174919465.5657, -249248344360967.72, 9708622510473064.0,
)
J0_RQ = (
    499.563147152651, 173785.4016763747, 48440965.83399621, 11185553704.535683, 2112775201154.892,
    310518229857422.56, 3.1812195594320496e+16, 1.7108629408104315e+18,
)
J1_PP = (
    0.0007621256162081731, 0.07313970569409176, 1.1271960812968493, 5.112079511468076, 8.424045901417724,
    5.214515986823615, 1.0,
)
J1_PQ = (
    0.0005713231280725487, 0.06884559087544954, 1.105142326340617, 5.073863861286015, 8.399855543276042,
    5.209828486823619, 1.0,
)
J1_QP = (
    0.05108625947501766, 4.982138729512334, 75.82382841325453, 366.7796093601508, 710.8563049989261,
    597.4896124006136, 211.68875710057213, 25.207020585802372,
)
J1_QQ = (
    74.23732770356752, 1056.4488603826283, 4986.410583376536, 9562.318924047562, 7997.041604473507,
    2826.1927851763908, 336.0936078106983,
)
J1_RP = (
    -899971225.7055594, 452228297998.19403, -72749424522181.83, 3682957328638529.0,
)
J1_RQ = (
    620.8364781180543, 256987.25675774884, 83514679.14319493, 22151159547.97925, 4749141220799.914,
    784369607876235.9, 8.952223361846274e+16, 5.322786203326801e+18,
)
Y0_YP = (
    15592.436785523574, -14663929.59039716, 5435264770.518765, -982136065717.9115, 87590639439536.7,
    -3466283033847297.0, 4.4273326857256984e+16, -1.8495080043698668e+16,
)
Y0_YQ = (
    1041.2835366425984, 626107.330137135, 268919633.39381415, 86400248710.3935, 20297961275010.555,
    3171577528429750.5, 2.5059625617265306e+17,
)
Y1_YP = (
    1263204747.9017804, -647355876379.1603, 114509511541823.73, -8127702555013251.0, 2.024394757135949e+17,
    -7.788771962659501e+17,
)
Y1_YQ = (
    594.3015923461282, 235564.09294306856, 73481194.44597217, 18760131610.870617, 3882312774962.3857,
    620557727146953.8, 6.871410873553005e+16, 3.9727060811656064e+18,
)
I0E_A = (
    -4.4153416464793395e-18, 3.3307945188222384e-17, -2.431279846547955e-16, 1.715391285555133e-15,
    -1.1685332877993451e-14, 7.676185498604936e-14, -4.856446783111929e-13, 2.95505266312964e-12,
    -1.726826291441556e-11, 9.675809035373237e-11, -5.189795601635263e-10, 2.6598237246823866e-09,
    -1.300025009986248e-08, 6.046995022541919e-08, -2.670793853940612e-07, 1.1173875391201037e-06,
    -4.4167383584587505e-06, 1.6448448070728896e-05, -5.754195010082104e-05, 0.00018850288509584165,
    -0.0005763755745385824, 0.0016394756169413357, -0.004324309995050576, 0.010546460394594998,
    -0.02373741480589947, 0.04930528423967071, -0.09490109704804764, 0.17162090152220877, -0.3046826723431984,
    0.6767952744094761,
)
I0E_B = (
    -7.233180487874754e-18, -4.830504485944182e-18, 4.46562142029676e-17, 3.461222867697461e-17,
    -2.8276239805165836e-16, -3.425485619677219e-16, 1.7725601330565263e-15, 3.8116806693526224e-15,
    -9.554846698828307e-15, -4.150569347287222e-14, 1.54008621752141e-14, 3.8527783827421426e-13,
    7.180124451383666e-13, -1.7941785315068062e-12, -1.3215811840447713e-11, -3.1499165279632416e-11,
    1.1889147107846439e-11, 4.94060238822497e-10, 3.3962320257083865e-09, 2.266668990498178e-08,
    2.0489185894690638e-07, 2.8913705208347567e-06, 6.889758346916825e-05, 0.0033691164782556943,
    0.8044904110141088,
)
I1E_A = (
    2.7779141127610464e-18, -2.111421214358166e-17, 1.5536319577362005e-16, -1.1055969477353862e-15,
    7.600684294735408e-15, -5.042185504727912e-14, 3.223793365945575e-13, -1.9839743977649436e-12,
    1.1736186298890901e-11, -6.663489723502027e-11, 3.625590281552117e-10, -1.8872497517228294e-09,
    9.381537386495773e-09, -4.445059128796328e-08, 2.0032947535521353e-07, -8.568720264695455e-07,
    3.4702513081376785e-06, -1.3273163656039436e-05, 4.781565107550054e-05, -0.00016176081582589674,
    0.0005122859561685758, -0.0015135724506312532, 0.004156422944312888, -0.010564084894626197,
    0.024726449030626516, -0.05294598120809499, 0.1026436586898471, -0.17641651835783406, 0.25258718644363365,
)
I1E_B = (
    7.517296310842105e-18, 4.414348323071708e-18, -4.6503053684893586e-17, -3.209525921993424e-17,
    2.96262899764595e-16, 3.3082023109209285e-16, -1.8803547755107825e-15, -3.8144030724370075e-15,
    1.0420276984128802e-14, 4.272440016711951e-14, -2.1015418427726643e-14, -4.0835511110921974e-13,
    -7.198551776245908e-13, 2.0356285441470896e-12, 1.4125807436613782e-11, 3.2526035830154884e-11,
    -1.8974958123505413e-11, -5.589743462196584e-10, -3.835380385964237e-09, -2.6314688468895196e-08,
    -2.512236237870209e-07, -3.882564808877691e-06, -0.00011058893876262371, -0.009761097491361469,
    0.7785762350182801,
)
K0_A = (
    1.374465435613523e-16, 4.25981614279661e-14, 1.0349695257633842e-11, 1.904516377220209e-09,
    2.5347910790261494e-07, 2.286212103119452e-05, 0.001264615411446926, 0.0359799365153615,
    0.3442898999246285, -0.5353273932339028,
)
K0E_B = (
    5.300433772686263e-18, -1.6475804301524212e-17, 5.2103915050390274e-17, -1.678231096805412e-16,
    5.512055978524319e-16, -1.848593377343779e-15, 6.3400764774050706e-15, -2.2275133269916698e-14,
    8.032890775363575e-14, -2.9800969231727303e-13, 1.140340588208475e-12, -4.514597883373944e-12,
    1.8559491149547177e-11, -7.957489244477107e-11, 3.577397281400301e-10, -1.69753450938906e-09,
    8.574034017414225e-09, -4.660489897687948e-08, 2.766813639445015e-07, -1.8317555227191195e-06,
    1.39498137188765e-05, -0.00012849549581627802, 0.0015698838857300533, -0.0314481013119645,
    2.4403030820659555,
)
K1_A = (
    -7.023863479386288e-18, -2.427449850519366e-15, -6.666901694199329e-13, -1.4114883926335278e-10,
    -2.213387630734726e-08, -2.4334061415659684e-06, -0.0001730288957513052, -0.006975723859639864,
    -0.12261118082265715, -0.3531559607765449, 1.5253002273389478,
)
K1E_B = (
    -5.756744483665017e-18, 1.7940508731475592e-17, -5.689462558442859e-17, 1.838093544366639e-16,
    -6.057047248373319e-16, 2.038703165624334e-15, -7.019837090418314e-15, 2.4771544244813043e-14,
    -8.976705182324994e-14, 3.3484196660784293e-13, -1.2891739609510289e-12, 5.13963967348173e-12,
    -2.1299678384275683e-11, 9.218315187605006e-11, -4.1903547593418965e-10, 2.015049755197033e-09,
    -1.0345762465678097e-08, 5.7410841254500495e-08, -3.5019606030878126e-07, 2.406484947837217e-06,
    -1.936197974166083e-05, 0.00019521551847135162, -0.002857816859622779, 0.10392373657681724,
    2.7206261904844427,
)


def _i0e_series(x: Real) -> Real:
    """exp(-|x|) I0(|x|) for |x| = `x` (Math.h's calc_i0e)."""
    small = chbevl(x / 2.0 - 2.0, I0E_A)
    large = chbevl(32.0 / x - 2.0, I0E_B) / x.sqrt()
    return where(x <= 8.0, small, large)


def i0(z: Real) -> Real:
    x = z.abs()
    small = x.exp() * chbevl(x / 2.0 - 2.0, I0E_A)
    large = x.exp() * chbevl(32.0 / x - 2.0, I0E_B) / x.sqrt()
    return where(x <= 8.0, small, large)


def i0e(z: Real) -> Real:
    return _i0e_series(z.abs())


def _i1e_coefficients(dtype: torch.dtype) -> tuple[tuple[float, ...], tuple[float, ...]]:
    # Math.h keeps the float series shorter: its leading terms are below float's precision.
    return (I1E_A[-17:], I1E_B[-7:]) if dtype == torch.float32 else (I1E_A, I1E_B)


def _odd(z: Real, magnitude: Real) -> Real:
    return where(z < 0.0, -magnitude, magnitude)


def i1(z: Real) -> Real:
    x = z.abs()
    a, b = _i1e_coefficients(z.dtype)
    small = x.exp() * x * chbevl(x / 2.0 - 2.0, a)
    large = x.exp() * chbevl(32.0 / x - 2.0, b) / x.sqrt()
    return _odd(z, where(x <= 8.0, small, large))


def i1e(z: Real) -> Real:
    x = z.abs()
    a, b = _i1e_coefficients(z.dtype)
    small = chbevl(x / 2.0 - 2.0, a) * x
    large = chbevl(32.0 / x - 2.0, b) / x.sqrt()
    return _odd(z, where(x <= 8.0, small, large))


def modified_bessel_i0(z: Real) -> Real:
    x = z.abs()
    small = x.exp() * chbevl(x / 2.0 - 2.0, I0E_A)
    large = x.exp() * chbevl(32.0 / x - 2.0, I0E_B) / x.sqrt()
    return where(x <= 8.0, small, large)


def modified_bessel_i1(z: Real) -> Real:
    x = z.abs()
    small = chbevl(x / 2.0 - 2.0, I1E_A) * x * x.exp()
    large = x.exp() * chbevl(32.0 / x - 2.0, I1E_B) / x.sqrt()
    return _odd(z, where(x <= 8.0, small, large))


def _second_kind(x: Real, small: Real, large: Real) -> Real:
    """K0/K1 (scaled or not): infinite at 0, NaN for negative x, else the branch of `x`."""
    return select(where(x <= 2.0, small, large), (x.eq(0.0), float("inf")), (x < 0.0, float("nan")))


def modified_bessel_k0(x: Real) -> Real:
    small = chbevl(x * x - 2.0, K0_A) - (0.5 * x).log() * modified_bessel_i0(x)
    large = (-x).exp() * chbevl(8.0 / x - 2.0, K0E_B) / x.sqrt()
    return _second_kind(x, small, large)


def modified_bessel_k1(x: Real) -> Real:
    small = (0.5 * x).log() * modified_bessel_i1(x) + chbevl(x * x - 2.0, K1_A) / x
    large = (-x).exp() * chbevl(8.0 / x - 2.0, K1E_B) / x.sqrt()
    return _second_kind(x, small, large)


def scaled_modified_bessel_k0(x: Real) -> Real:
    small = (chbevl(x * x - 2.0, K0_A) - (0.5 * x).log() * modified_bessel_i0(x)) * x.exp()
    large = chbevl(8.0 / x - 2.0, K0E_B) / x.sqrt()
    return _second_kind(x, small, large)


def scaled_modified_bessel_k1(x: Real) -> Real:
    small = ((0.5 * x).log() * modified_bessel_i1(x) + chbevl(x * x - 2.0, K1_A) / x) * x.exp()
    large = chbevl(8.0 / x - 2.0, K1E_B) / x.sqrt()
    return _second_kind(x, small, large)


def _hankel(x: Real, z: Real, p: tuple[tuple[float, ...], tuple[float, ...]],
            q: tuple[tuple[float, ...], tuple[float, ...]], phase: float, second_kind: bool) -> Real:
    """Hankel's asymptotic form for x > 5: sqrt(2 / (pi x)) (P cos(x - phase) - 5 / x Q sin(x - phase))
    (second kind: P sin + 5 / x Q cos), P and Q rational functions of `z` (25 / x**2)."""
    pp, pq = polevl(z, p[0]), polevl(z, p[1])
    qp, qq = polevl(z, q[0]), polevl(z, q[1])
    angle = x - phase
    cos, sin = angle.apply("cos"), angle.apply("sin")
    if second_kind:
        wave = pp / pq * sin + 5.0 / x * (qp / qq) * cos
    else:
        wave = pp / pq * cos - 5.0 / x * (qp / qq) * sin
    return wave * SQRT_2_PI / x.sqrt()


def bessel_j0(z: Real) -> Real:
    x = z.abs()
    x2 = x * x
    small = (x2 - 5.783185962946784) * (x2 - 30.471262343662087) * polevl(x2, J0_RP) / polevl(x2, J0_RQ)
    tiny = 1.0 - x2 / 4.0
    large = _hankel(x, 25.0 / x2, (J0_PP, J0_PQ), (J0_QP, J0_QQ), PI_4, second_kind=False)
    return where(x <= 5.0, where(x < 0.00001, tiny, small), large)


def _j1_positive(x: Real) -> Real:
    x2 = x * x
    small = polevl(x2, J1_RP) / polevl(x2, J1_RQ) * x * (x2 - 14.681970642123893) * (x2 - 49.2184563216946)
    z = 5.0 / x * (5.0 / x)
    large = _hankel(x, z, (J1_PP, J1_PQ), (J1_QP, J1_QQ), PI3_4, second_kind=False)
    return where(x <= 5.0, small, large)


def bessel_j1(x: Real) -> Real:
    # Math.h: j1(x) = -j1(-x) for x < 0 (-0.0 is not negated: j1(-0.0) is -0.0)
    negative = x < 0.0
    magnitude = _j1_positive(where(negative, -x, x))
    return where(negative, -magnitude, magnitude)


def bessel_y0(x: Real) -> Real:
    x2 = x * x
    small = polevl(x2, Y0_YP) / polevl(x2, Y0_YQ) + TWO_PI * x.log() * bessel_j0(x)
    large = _hankel(x, 25.0 / x2, (J0_PP, J0_PQ), (J0_QP, J0_QQ), PI_4, second_kind=True)
    small = select(small, (x.eq(0.0), float("-inf")), (x < 0.0, float("nan")))
    return where(x <= 5.0, small, large)


def bessel_y1(x: Real) -> Real:
    x2 = x * x
    small = x * (polevl(x2, Y1_YP) / polevl(x2, Y1_YQ)) + TWO_PI * (_j1_positive(x) * x.log() - 1.0 / x)
    z = 5.0 / x * (5.0 / x)
    large = _hankel(x, z, (J1_PP, J1_PQ), (J1_QP, J1_QQ), PI3_4, second_kind=True)
    small = select(small, (x.eq(0.0), float("-inf")), (x < 0.0, float("nan")))
    return where(x <= 5.0, small, large)


def spherical_bessel_j0(x: Real) -> Real:
    x2 = x * x
    series = x.const(1.0 / 6227020800.0)
    for c in (-1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0):
        series = c + x2 * series
    series = 1.0 + x2 * series
    return select(x.apply("sin") / x, (x.isinf(), 0.0), (x.abs() < 0.5, series))


FUNCTIONS = {
    aten.i0.default: i0,
    aten.special_i0e.default: i0e,
    aten.special_i1.default: i1,
    aten.special_i1e.default: i1e,
    aten.special_modified_bessel_i0.default: modified_bessel_i0,
    aten.special_modified_bessel_i1.default: modified_bessel_i1,
    aten.special_modified_bessel_k0.default: modified_bessel_k0,
    aten.special_modified_bessel_k1.default: modified_bessel_k1,
    aten.special_scaled_modified_bessel_k0.default: scaled_modified_bessel_k0,
    aten.special_scaled_modified_bessel_k1.default: scaled_modified_bessel_k1,
    aten.special_bessel_j0.default: bessel_j0,
    aten.special_bessel_j1.default: bessel_j1,
    aten.special_bessel_y0.default: bessel_y0,
    aten.special_bessel_y1.default: bessel_y1,
    aten.special_spherical_bessel_j0.default: spherical_bessel_j0,
}


def _lowering(fn):
    def lower(ctx, node, x):
        return special_pointwise(node, fn, x)

    lower.__name__ = f"lower_{fn.__name__}"
    return lower


for _op, _fn in FUNCTIONS.items():
    TABLE.register("pointwise", _op)(_lowering(_fn))
