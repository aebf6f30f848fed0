"""kiln's vector math, in C++ on the SIMD layer (`vector_layer.py`); no libmvec call, and no
libm call on the hot path (sin/cos call libm for lanes beyond 1.6e6 only).

The hot float32 functions (exp, exp2, expm1, log, log1p, tanh, sigmoid, erf) are evaluated in
float32: Cody-Waite range reduction, then minimax or Cephes polynomials by Horner's rule
(unrolled: constant coefficients) with fused multiply-adds (`kiln::fma`: one instruction per
vector where the ISA has FMA); on AVX-512, 2^n scaling is one vscalefps and log's exponent and
mantissa come from vgetexpps/vgetmantps. Special values come out of the arithmetic where they
can (exp clamps its input, and the scaling overflows or underflows) rather than from selects.
The others (log2, sin, cos, pow) are written once for float64 registers
(`vector_math_float64.py`); their float32 version evaluates each half of the vector in one
float64 register and rounds once to float32, so its error is the float64 one (far below a
float32 ulp) plus that final rounding.

Bounds, asserted by `tests/test_codegen_cpp_vector_math.py` (dense sweeps, 200k random bit
patterns covering every magnitude, denormals and NaNs, and NaN, +-inf, +-0, the overflow and
underflow thresholds; compiled with and without FMA), in ulps: float32 against the float64
result rounded to float32, float64 against torch's float64 (itself within about 1 ulp):

=========  =======  =======  ==============================================================
function   float32  float64  method
=========  =======  =======  ==============================================================
exp        1        1        2^n * p(r), |r| <= ln2/2; float32: Cephes' degree-7 polynomial,
                             float64: degree-13 Taylor; 2^n applied in one vscalefps
                             (AVX-512) or two scalings
exp2       1        1        as exp, with r = (x - n) ln2 (x - n is exact)
expm1      1        3        float32: 2^n (p + 1 - 2^-n) for n >= 0, p 2^n + (2^n - 1) below,
                             p = expm1(r) (exp's polynomial); float64: Taylor below ln2/2,
                             exp(x) - 1 above
log        2        3        float32: 2^e * m, m in [sqrt(1/2), sqrt(2)), Cephes' logf
                             polynomial; float64: 2 atanh((m-1)/(m+1)) series
log2       1        3        (float64) e + log(m) / ln2: exact at powers of 2
log1p      1        4        float32: log(u) + c / u, u = 1 + x, c its rounding error
                             (Fast2Sum); float64: log(1 + x) * x / ((1 + x) - 1)
tanh       2        3        float32: -d / (2 + d), d = expm1(-2|x|) = p 2^n + (2^n - 1)
                             (exp's polynomial p, n <= 0); float64: expm1(2|x|) / (expm1(2|x|) + 2); sign restored
sigmoid    2        2 (4)    float32: e / (1 + e) or 1 / (1 + e), e = exp(-|x|) (denormal
                             results kept); float64: 1 / (1 + exp(-x)), as eager; (4): without
                             FMA (unfused exp polynomial)
erf        2        scalar   float32: x Q_i(|x| - c_i) on 8 intervals of width 0.5 in [0, 4),
                             Q_i degree-6 fits of erf(x)/x whose coefficients each lane
                             picks with a register permute (vpermps); +-1 beyond 3.93
sin, cos   1        2        (float64) x = n pi/2 + r, pi/2 in three parts (exact for
                             |x| < 1.6e6; libm beyond), fdlibm's kernel polynomials
pow        1        scalar   (float64) exp(y log|x|) with C99's special cases
sqrt       0        0        the ISA's square root (lane by lane: one instruction)
rsqrt      1        1        1 / sqrt(x)
=========  =======  =======  ==============================================================

Measured maxima (same sweeps, with and without FMA, on AVX-512): float32 exp 1, exp2 1, expm1
1, log 1, log2 0, log1p 1, tanh 2, sigmoid 2, erf 2, sin 0, cos 0, pow 1; float64 exp 1, exp2 1,
expm1 3, log 3, log2 3, log1p 4, tanh 3, sigmoid 2 (4 without FMA), sin 2, cos 2.

"scalar": no vector version; a kernel using it stays scalar and its source says why (erfc has
no vector version in either dtype).
"""

from __future__ import annotations

from .vector_math_float64 import VECTOR_MATH_FLOAT64

# erf(x) / x on [0, 4) in 8 intervals of width 0.5: per interval a degree-6 polynomial in
# x - (center), highest degree first, from numpy's Chebyshev interpolation (400 nodes) against
# math.erf in float64, rounded to float32 (relative error of the fits before rounding below
# 6e-8). Row k holds coefficient k of the 8 intervals, twice (a 16-lane register's table).
_ERF_TABLES = ",\n".join([
    "{-0.018023133277893066f, 0.014145052060484886f, 0.010073350742459297f, -0.003307848470285535f, -0.002829392906278372f, -0.00036323550739325583f, 0.0001363610936095938f, 8.94043332664296e-05f, -0.018023133277893066f, 0.014145052060484886f, 0.010073350742459297f, -0.003307848470285535f, -0.002829392906278372f, -0.00036323550739325583f, 0.0001363610936095938f, 8.94043332664296e-05f}",
    "{-0.03497083857655525f, -0.03727072849869728f, 0.008085067383944988f, 0.01486184261739254f, 0.0035719340667128563f, -0.0006746437284164131f, -0.0007171131437644362f, -0.0003556574520189315f, -0.03497083857655525f, -0.03727072849869728f, 0.008085067383944988f, 0.01486184261739254f, 0.0035719340667128563f, -0.0006746437284164131f, -0.0007171131437644362f, -0.0003556574520189315f}",
    "{0.08902176469564438f, -0.024854930117726326f, -0.05798504129052162f, -0.01967688836157322f, 0.0028537556063383818f, 0.004720832221210003f, 0.002648319350555539f, 0.0013441421324387193f, 0.08902176469564438f, -0.024854930117726326f, -0.05798504129052162f, -0.01967688836157322f, 0.0028537556063383818f, 0.004720832221210003f, 0.002648319350555539f, 0.0013441421324387193f}",
    "{0.10469185560941696f, 0.16932424902915955f, 0.06634185463190079f, -0.013673183508217335f, -0.025507833808660507f, -0.01623946614563465f, -0.008893189951777458f, -0.00505434675142169f, 0.10469185560941696f, 0.16932424902915955f, 0.06634185463190079f, -0.013673183508217335f, -0.025507833808660507f, -0.01623946614563465f, -0.008893189951777458f, -0.00505434675142169f}",
    "{-0.33535104990005493f, -0.10021761804819107f, 0.08463019877672195f, 0.11409442871809006f, 0.07910993695259094f, 0.04741549864411354f, 0.029098553583025932f, 0.018962016329169273f, -0.33535104990005493f, -0.10021761804819107f, 0.08463019877672195f, 0.11409442871809006f, 0.07910993695259094f, 0.04741549864411354f, 0.029098553583025932f, 0.018962016329169273f}",
    "{-0.18116548657417297f, -0.40703511238098145f, -0.4014393091201782f, -0.29202139377593994f, -0.19406753778457642f, -0.13200490176677704f, -0.09466516971588135f, -0.07111086696386337f, -0.18116548657417297f, -0.40703511238098145f, -0.4014393091201782f, -0.29202139377593994f, -0.19406753778457642f, -0.13200490176677704f, -0.09466516971588135f, -0.07111086696386337f}",
    "{1.105305552482605f, 0.9482074975967407f, 0.7383201122283936f, 0.5638123750686646f, 0.4437943398952484f, 0.3635997772216797f, 0.30769097805023193f, 0.2666666507720947f, 1.105305552482605f, 0.9482074975967407f, 0.7383201122283936f, 0.5638123750686646f, 0.4437943398952484f, 0.3635997772216797f, 0.30769097805023193f, 0.2666666507720947f}"])

_VECTOR_MATH_FLOAT32 = r"""
// ---- kiln's float32 vector math (accuracy: kiln/codegen_cpp/_internal/vector_math.py) ----
namespace kiln {
static inline vf32 pow2(vi32 n) {  // 2^n for n in [-126, 127]
    return (vf32)((n + 127) << 23);
}
static inline vf32 round_to_int(vf32 x) {  // |x| < 2^22
    return (x + 12582912.0f) - 12582912.0f;  // 1.5 * 2^23
}

// exp(r) for |r| <= ln2/2; expm1_reduced is exp(r) - 1 = r + r^2 P(r) (Cephes' expf polynomial).
static inline vf32 expm1_reduced(vf32 r) {
    static const float cephes[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                                   1.6666665459e-1f, 5.0000001201e-1f};
    return fma(horner(r, cephes), r * r, r);
}
static inline vf32 exp_reduced(vf32 r) { return expm1_reduced(r) + 1; }
// y * 2^n for integral n in [-252, 254], rounded once (a denormal result too): AVX-512's
// vscalefps where there is one, else two scalings (2^n alone may not be a normal float).
#if defined(__AVX512F__) && KILN_VECTOR_BYTES == 64
static inline vf32 scale(vf32 y, vf32 n) { return (vf32)_mm512_scalef_ps((__m512)y, (__m512)n); }
#elif defined(__AVX512VL__) && KILN_VECTOR_BYTES == 32
static inline vf32 scale(vf32 y, vf32 n) { return (vf32)_mm256_scalef_ps((__m256)y, (__m256)n); }
#elif defined(__AVX512VL__) && KILN_VECTOR_BYTES == 16
static inline vf32 scale(vf32 y, vf32 n) { return (vf32)_mm_scalef_ps((__m128)y, (__m128)n); }
#else
static inline vf32 scale(vf32 y, vf32 n) {
    vi32 k = __builtin_convertvector(n, vi32), half = k >> 1;
    return y * pow2(half) * pow2(k - half);
}
#endif
// y * 2^n for integral n in [-126, 127] (2^n a normal float): one multiply.
static inline vf32 scale_normal(vf32 y, vf32 n) {
#if defined(__AVX512F__) && KILN_VECTOR_BYTES == 64
    return scale(y, n);
#else
    return y * pow2(__builtin_convertvector(n, vi32));
#endif
}
static inline vf32 clamp(vf32 x, float bound) {  // NaN stays NaN
    x = x > bound ? splat<vf32>(bound) : x;
    return x < -bound ? splat<vf32>(-bound) : x;
}

// n = round(x / ln2) and r = x - n ln2 (ln2 in two parts), |r| <= ln2/2 (a rounding away),
// for |x| < 2^21: the fma adding 1.5 * 2^23 rounds x / ln2 to an integer.
static inline vf32 reduce_ln2(vf32 x, vf32& n) {
    n = fma(x, splat<vf32>(1.44269504088896341f), splat<vf32>(12582912.0f)) - 12582912.0f;
    return fma(n, splat<vf32>(2.12194440e-4f), fma(n, splat<vf32>(-0.693359375f), x));
}
// exp of x in [-87, 88] (callers guarantee it): no special case.
static inline vf32 exp_in_range(vf32 x) {
    vf32 n, r = reduce_ln2(x, n);
    return scale_normal(exp_reduced(r), n);
}
// exp: x clamped to [-150, 150] (NaN stays NaN), whose scaling overflows to inf and underflows
// to 0 where exp does, so no special case is selected.
static inline vf32 exp(vf32 x) {
    vf32 n, r = reduce_ln2(clamp(x, 150), n);
    return scale(exp_reduced(r), n);
}
static inline vf32 exp2(vf32 x) {
    vf32 c = clamp(x, 200), n = round_to_int(c), f = c - n;  // exact
    return scale(exp_reduced(fma(f, splat<vf32>(0.693145751953125f), f * 1.428606765330187045e-06f)), n);
}
// expm1 = 2^n (p + 1) - 1, p = expm1(r): for n >= 0 as 2^n (p + (1 - 2^-n)), for n < 0 as
// p 2^n + (2^n - 1) (both exact but for the final roundings); x clamped to [-87, 89].
static inline vf32 expm1(vf32 x) {
    vf32 c = x > 89 ? splat<vf32>(89) : x;
    c = c < -87 ? splat<vf32>(-87) : c;
    vf32 n, r = reduce_ln2(c, n);
    vf32 p = expm1_reduced(r);
    vf32 m = n > 64 ? splat<vf32>(64) : (n < 0 ? vf32{} : n);  // 1 - 2^-n rounds to 1 beyond 24
    vf32 nonnegative = scale(p + (1 - scale_normal(splat<vf32>(1), -m)), n);
    vf32 two_n = scale_normal(splat<vf32>(1), n);
    vf32 negative = fma(p, two_n, two_n - 1);
    vf32 y = n < 0 ? negative : nonnegative;
    return x == 0 ? x : y;  // keeps -0
}

// sigmoid takes exp(-|x|) (no overflow: a denormal sigmoid(x) stays exact) and divides once.
static inline vf32 sigmoid(vf32 x) {
    vf32 t = -abs(x), n, r = reduce_ln2(t < -150 ? splat<vf32>(-150) : t, n);  // exp(t), t <= 0 (or NaN)
    vf32 e = scale(exp_reduced(r), n);
    return (x < 0 ? e : splat<vf32>(1)) / (1 + e);
}
// tanh(|x|) = -d / (2 + d), d = expm1(-2|x|) = p 2^n + (2^n - 1) (n <= 0, p = expm1(r)): one
// polynomial, exact for small |x| (n = 0: d = p); |x| clamped to 9.1 (tanh rounds to 1 there);
// the sign restored once (keeps -0 and NaN).
static inline vf32 tanh(vf32 x) {
    vf32 a = abs(x);
    vf32 n, r = reduce_ln2(-2 * (a > 9.1f ? splat<vf32>(9.1f) : a), n);
    vf32 two_n = scale_normal(splat<vf32>(1), n);
    vf32 d = fma(expm1_reduced(r), two_n, two_n - 1);
    return copysign(d / (-2 - d), x);
}

// log: x = 2^e m, m in [sqrt(1/2), sqrt(2)), log(m) = f - f^2/2 + f^3 P(f), f = m - 1 (Cephes' logf).
// e and m in [1, 2) from AVX-512's vgetexpps/vgetmantps where there are (subnormals, 0, inf and
// NaN handled by the ISA), else from the bits (subnormals scaled by 2^23 first).
static inline vf32 log(vf32 x) {
    static const float cephes[] = {7.0376836292E-2f, -1.1514610310E-1f, 1.1676998740E-1f, -1.2420140846E-1f,
                                   1.4249322787E-1f, -1.6668057665E-1f, 2.0000714765E-1f, -2.4999993993E-1f,
                                   3.3333331174E-1f};
#if defined(__AVX512F__) && KILN_VECTOR_BYTES == 64
    vf32 e = (vf32)_mm512_getexp_ps((__m512)x);  // -inf at 0, inf at inf
    vf32 m = (vf32)_mm512_getmant_ps((__m512)x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_nan);  // NaN below 0
    vmask high = m > 1.41421356f;
    vf32 f = high ? m * 0.5f - 1 : m - 1;  // exact
    e = high ? e + 1 : e;
#else  // the bits less those of sqrt(1/2): e in the high bits, m in [sqrt(1/2), sqrt(2)) in the low
    vmask subnormal = x < 1.17549435e-38f;
    vi32 bits = (vi32)(subnormal ? x * 8388608.0f : x) - 0x3f3504f3;  // 2^23
    vf32 e = __builtin_convertvector((bits >> 23) - (subnormal & 23), vf32);
    vf32 f = (vf32)((bits & 0x7fffff) + 0x3f3504f3) - 1;  // exact
#endif
    vf32 z = f * f;
    vf32 y = fma(e, splat<vf32>(-2.12194440e-4f), f * z * horner(f, cephes));
    y = fma(e, splat<vf32>(0.693359375f), f + fma(z, splat<vf32>(-0.5f), y));
    y = x == 0 ? splat<vf32>(-__builtin_inff()) : y;
    y = x == __builtin_inff() ? x : y;
#if !(defined(__AVX512F__) && KILN_VECTOR_BYTES == 64)
    y = ((x < 0) | (x != x)) ? splat<vf32>(__builtin_nanf("")) : y;
#endif
    return y;
}
// c / u without a division instruction where AVX-512 has vrcp14ps: a reciprocal estimate r
// (relative error below 2^-14), the quotient q = c r, then one correction from its exact
// residual c - u q: relative error ~2^-28 before the final rounding. A vdivps costs 5 to 16
// cycles of throughput per vector (one port, not pipelined), as much as all of log1p's other
// instructions together; these three are pipelined. Elsewhere: a division.
static inline vf32 quotient(vf32 c, vf32 u) {
#if defined(__AVX512F__) && KILN_VECTOR_BYTES == 64
    vf32 r = (vf32)_mm512_rcp14_ps((__m512)u);
#elif defined(__AVX512VL__) && KILN_VECTOR_BYTES == 32
    vf32 r = (vf32)_mm256_rcp14_ps((__m256)u);
#elif defined(__AVX512VL__) && KILN_VECTOR_BYTES == 16
    vf32 r = (vf32)_mm_rcp14_ps((__m128)u);
#else
#define KILN_DIVIDES
    return c / u;
#endif
#ifndef KILN_DIVIDES
    vf32 q = c * r;
    return fma(r, fma(-u, q, c), q);
#endif
#undef KILN_DIVIDES
}
// log1p(x) = log(u) + c / u, u = 1 + x rounded and c = 1 + x - u its rounding error (exact:
// Fast2Sum, the larger operand first). |c / u| <= 2^-24 and at most the result's size (all of
// it when |x| < 2^-24: u = 1, c = x), so `quotient`'s 2^-28 costs under 1/16 ulp.
static inline vf32 log1p(vf32 x) {
    vf32 u = 1 + x;
    vf32 c = abs(x) <= 1 ? (1 - u) + x : (x - u) + 1;
    vf32 y = log(u) + quotient(c, u);
    y = (x == 0) | (x == __builtin_inff()) ? x : y;  // keeps -0
    return u == 0 ? splat<vf32>(-__builtin_inff()) : y;
}

// table[i] per lane, i in [0, 8): one permute (vpermps) where a register holds 8 floats or
// more (`table` holds 16: its 8 entries twice), else a load per lane.
static inline vf32 lookup8(const float* table, vi32 i) {
#if KILN_LANES >= 8 && !defined(__clang__)
    return __builtin_shuffle(load(table), i);
#else
    vf32 r;
    for (int k = 0; k < KILN_LANES; ++k) r[k] = table[i[k]];
    return r;
#endif
}
// erf(x) = x Q_i(|x| - c_i) on 8 intervals of [0, 4) (the coefficients picked per lane); |x|
// clamped to 3.93, beyond which erf rounds to 1; the sign restored once (keeps -0 and NaN).
static inline vf32 erf(vf32 x) {
    static const float fit[7][16] = {""" + _ERF_TABLES + r"""};
    vf32 a = abs(x);
    a = a > 3.93f ? splat<vf32>(3.93f) : a;
    vi32 i = __builtin_convertvector(a * 2, vi32) & 7;  // NaN: any interval, NaN anyway
    vf32 t = a - fma(__builtin_convertvector(i, vf32), splat<vf32>(0.5f), splat<vf32>(0.25f));
    vf32 p = lookup8(fit[0], i);
#pragma GCC unroll 8
    for (int k = 1; k < 7; ++k) p = fma(p, t, lookup8(fit[k], i));
    vf32 y = a * p;
    return copysign(y > 1 ? splat<vf32>(1) : y, x);
}

// float32 functions evaluated in float64 and rounded once.
// (on the two float64 halves of the vector, each one register: see vector_layer.py's vf64x2)
static inline vf32 log2(vf32 x) { return in_float64(x, [](vd h) { return log2_d(h); }); }
static inline vf32 sin(vf32 x) { return in_float64(x, [](vd h) { return sin_d(h); }); }
static inline vf32 cos(vf32 x) { return in_float64(x, [](vd h) { return cos_d(h); }); }
static inline vf32 pow(vf32 x, vf32 y) { return in_float64(x, y, [](vd a, vd b) { return pow_d(a, b); }); }
}  // namespace kiln
"""

VECTOR_MATH = VECTOR_MATH_FLOAT64 + _VECTOR_MATH_FLOAT32
