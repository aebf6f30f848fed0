"""kiln's vector math, in C++ on the SIMD layer (`vector_layer.py`); no libm or libmvec call.

exp, sigmoid and tanh on float32 are evaluated in float32 (Cephes' expf and tanhf
polynomials: they are the hot ones, and a float64 evaluation costs twice the registers and
slow float64 divisions). The other functions are written once for float64 vectors; their
float32 version converts to float64, evaluates, and rounds once to float32, so its error is
the float64 one (far below a float32 ulp) plus that final rounding.

Bounds, asserted by `tests/test_codegen_cpp_vector_math.py` (dense sweeps, 300k random bit
patterns covering every magnitude, denormals and NaNs, and NaN, +-inf, +-0, the overflow and
underflow thresholds), in ulps: float32 against the float64 result rounded to float32, float64
against torch's float64 (itself within about 1 ulp):

=========  =======  =======  ==============================================================
function   float32  float64  method
=========  =======  =======  ==============================================================
exp        1        1        2^n * p(r), |r| <= ln2/2; float32: degree-7 Cephes polynomial,
                             float64: degree-13 Taylor; 2^n applied in two scalings
expm1      1 (0)    3        Taylor below ln2/2, exp(x) - 1 above
log        1 (0)    3        2^e * m, 2 atanh((m-1)/(m+1)) series, m in [sqrt(1/2), sqrt(2))
log1p      1 (0)    4        log(1 + x) * x / ((1 + x) - 1)
tanh       1        3        float32: Cephes polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1)
                             above; float64: expm1(2|x|) / (expm1(2|x|) + 2); sign restored
sigmoid    2        2        float32: e / (1 + e) or 1 / (1 + e), e = exp(-|x|) (denormal
                             results kept); float64: 1 / (1 + exp(-x)), as eager
erf        1        scalar   Taylor below 1; 1 - exp(-x^2) g(x), g a Chebyshev fit of
                             erfc(x) e^(x^2) on [1, 4]; +-1 beyond 4
=========  =======  =======  ==============================================================

(in parentheses: the largest error measured where it is below the bound, which keeps room
for the final rounding.) float64 erf has no vector version yet: a kernel using it stays
scalar, and its source says so.
"""

from __future__ import annotations

import math

# erf(x) = 2x / sqrt(pi) * sum (-x^2)^n / (n! (2n + 1)), n <= 17 (below 1e-17 for |x| < 1).
_ERF_SERIES = ", ".join(f"{(-1) ** n / (math.factorial(n) * (2 * n + 1))!r}" for n in range(17, -1, -1))

# Coefficients of g(u) = erfc(x) exp(x^2), u = (2x - 5) / 3 on x in [1, 4], highest degree
# first: a degree-14 Chebyshev fit (numpy.polynomial.chebyshev) of math.erfc, relative error
# 2.4e-10 (erf's error is that times erfc(x) <= 0.16).
_ERFC_SCALED = (
    "1.8130124344194503e-06, -5.058179193220625e-06, 7.473545482341293e-06, -2.0489641206856938e-05, "
    "6.367237058006056e-05, -0.00016449745082920632, 0.00040855915073322393, -0.0010047884625579368, "
    "0.002403783826986152, -0.005570928958783209, 0.012489356649539575, -0.027005275783583655, "
    "0.05611049427315718, -0.11152102074917318, 0.21080636405462602")

VECTOR_MATH = r"""
// ---- kiln's vector math (accuracy: kiln/codegen_cpp/_internal/vector_math.py) ----
namespace kiln {
static inline vf32 pow2(vi32 n) {  // 2^n for n in [-126, 127]
    return (vf32)((n + 127) << 23);
}

// float32 exp in float32 (Cephes' expf: Cody-Waite reduction, degree-7 polynomial).
static inline vf32 exp(vf32 x) {
    vf32 t = x * 1.44269504088896341f;
    t = t > 200 ? splat<vf32>(200) : t;
    t = t < -200 ? splat<vf32>(-200) : t;
    vf32 n = (t + 12582912.0f) - 12582912.0f;  // round to nearest: 1.5 * 2^23
    vf32 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    vf32 p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r
              + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    vf32 y = p * (r * r) + r + 1;
    vi32 k = __builtin_convertvector(n, vi32), half = k >> 1;
    y = y * pow2(half) * pow2(k - half);
    y = x > 88.72283935546875f ? splat<vf32>(__builtin_inff()) : y;
    y = x < -103.972084045410f ? vf32{} : y;
    return x != x ? x : y;
}

// float32 sigmoid and tanh from the float32 exp. sigmoid takes exp(-|x|) (no overflow: a
// denormal sigmoid(x) stays exact) and divides once.
static inline vf32 sigmoid(vf32 x) {
    vf32 e = exp(-abs(x));
    return (x < 0 ? e : splat<vf32>(1)) / (1 + e);
}
static inline vf32 tanh(vf32 x) {
    vf32 a = abs(x), z = x * x;
    vf32 small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z
                  - 3.33332819422e-1f) * z * x + x;  // Cephes' tanhf below 0.625
    vf32 large = copysign(1 - 2 / (exp(2 * a) + 1), x);
    vf32 y = a < 0.625f ? small : large;
    y = a > 9.1f ? copysign(splat<vf32>(1), x) : y;
    return x == 0 ? x : y;  // keeps -0
}

// float64 math is written for one register of doubles, D (a vf64 spans two registers where
// float32 vectors fill one): compares and selects on a two-register vector are split lane by
// lane by GCC, so `per_register` runs the function on each half.
template <typename D> using mask_of = decltype(std::declval<D>() < std::declval<D>());
template <typename D, size_t N> static inline D horner(D x, const double (&c)[N]) {
    D p = splat<D>(c[0]);
    for (size_t k = 1; k < N; ++k) p = p * x + c[k];
    return p;
}
template <typename D> static inline D round_to_int(D x) {  // |x| < 2^51
    const double shifter = 6755399441055744.0;  // 1.5 * 2^52
    return (x + shifter) - shifter;
}
template <typename D> static inline D pow2_d(mask_of<D> n) {  // 2^n for n in [-1022, 1023]
    return (D)((n + 1023) << 52);
}
template <typename D> static inline D abs_d(D x) { return (D)((mask_of<D>)x & 0x7fffffffffffffffL); }
template <typename D> static inline D copysign_d(D x, D s) {
    return (D)(((mask_of<D>)abs_d(x)) | ((mask_of<D>)s & int64_t(0x8000000000000000uL)));
}

template <typename D> static inline D exp_d(D x) {
    using L = decltype(x < x);
    const double log2e = 1.4426950408889634, ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    static const double taylor[] = {1.0 / 6227020800, 1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800,
                                    1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120,
                                    1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0};
    D t = x * log2e;
    t = t > 1100 ? splat<D>(1100) : t;
    t = t < -1100 ? splat<D>(-1100) : t;
    D n = round_to_int(t);
    D r = (x - n * ln2_hi) - n * ln2_lo;
    L k = __builtin_convertvector(n, L), half = k >> 1;  // two scalings: 2^k may not be normal
    D y = horner(r, taylor) * pow2_d<D>(half) * pow2_d<D>(k - half);
    y = x > 709.782712893384 ? splat<D>(__builtin_inf()) : y;
    y = x < -745.2 ? D{} : y;
    return x != x ? x : y;
}

template <typename D> static inline D expm1_d(D x) {
    static const double taylor[] = {1.0 / 87178291200, 1.0 / 6227020800, 1.0 / 479001600, 1.0 / 39916800,
                                    1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720,
                                    1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0};
    D small = horner(x, taylor) * x;
    D y = abs_d(x) < 0.34657359027997264 ? small : exp_d(x) - 1;
    return x == 0 ? x : y;  // keeps -0
}

template <typename D> static inline D log_d(D x) {
    using L = decltype(x < x);
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    static const double atanh_series[] = {2.0 / 23, 2.0 / 21, 2.0 / 19, 2.0 / 17, 2.0 / 15, 2.0 / 13,
                                          2.0 / 11, 2.0 / 9, 2.0 / 7, 2.0 / 5, 2.0 / 3, 2.0};
    L subnormal = x < 2.2250738585072014e-308;
    D scaled = subnormal ? x * 18014398509481984.0 : x;  // 2^54
    L bits = (L)scaled;
    D e = __builtin_convertvector(((bits >> 52) & 0x7ff) - 1023 - (subnormal & 54), D);
    D m = (D)((bits & 0x000fffffffffffffL) | 0x3ff0000000000000L);  // in [1, 2)
    L high = m > 1.4142135623730951;
    m = high ? m * 0.5 : m;
    e = high ? e + 1 : e;
    D s = (m - 1) / (m + 1);
    D y = e * ln2_hi + (s * horner(s * s, atanh_series) + e * ln2_lo);
    y = x == 0 ? splat<D>(-__builtin_inf()) : y;
    y = x == __builtin_inf() ? x : y;
    return ((x < 0) | (x != x)) ? splat<D>(__builtin_nan("")) : y;
}

template <typename D> static inline D log1p_d(D x) {
    D u = 1 + x;
    D y = log_d(u) * (x / (u - 1));
    y = u == 1 ? x : y;
    return x == __builtin_inf() ? x : y;
}

template <typename D> static inline D tanh_d(D x) {
    D t = expm1_d(2 * abs_d(x));
    D y = abs_d(x) > 20 ? splat<D>(1) : t / (t + 2);
    return copysign_d(y, x);
}

template <typename D> static inline D sigmoid_d(D x) { return 1 / (1 + exp_d(-x)); }  // as eager: 0 below -709

template <typename D> static inline D erf_d(D x) {
    static const double taylor[] = {""" + _ERF_SERIES + r"""};  // erf(x) / (2x / sqrt(pi)) in x^2
    static const double erfc_scaled[] = {""" + _ERFC_SCALED + r"""};
    D a = abs_d(x);
    D small = horner(x * x, taylor) * x * 1.1283791670955126;
    D b = a > 4 ? splat<D>(4) : a;
    D large = 1 - exp_d(-b * b) * horner((2 * b - 5) * (1.0 / 3), erfc_scaled);
    D y = a < 1 ? small : copysign_d(a >= 4 ? splat<D>(1) : large, x);
    return x != x ? x : y;
}

#if KILN_LANES == 1
typedef vf64 vd;  // one lane: the vf64 is the register
template <typename F> static inline vf64 per_register(vf64 x, F f) { return f(x); }
#else
typedef double vd __attribute__((vector_size(KILN_VECTOR_BYTES)));
template <typename F> static inline vf64 per_register(vf64 x, F f) {
    vd half[2];
    std::memcpy(half, &x, sizeof(x));
    half[0] = f(half[0]);
    half[1] = f(half[1]);
    std::memcpy(&x, half, sizeof(x));
    return x;
}
#endif
#define KILN_FLOAT64_MATH(name)                                                                     \
    static inline vf64 name(vf64 x) { return per_register(x, [](vd h) { return name##_d(h); }); }
KILN_FLOAT64_MATH(exp)
KILN_FLOAT64_MATH(expm1)
KILN_FLOAT64_MATH(log)
KILN_FLOAT64_MATH(log1p)
KILN_FLOAT64_MATH(tanh)
KILN_FLOAT64_MATH(sigmoid)
#undef KILN_FLOAT64_MATH

// float32 functions evaluated in float64 and rounded once.
static inline vf32 expm1(vf32 x) { return narrow(expm1(widen(x))); }
static inline vf32 log(vf32 x) { return narrow(log(widen(x))); }
static inline vf32 log1p(vf32 x) { return narrow(log1p(widen(x))); }
static inline vf32 erf(vf32 x) { return narrow(per_register(widen(x), [](vd h) { return erf_d(h); })); }
}  // namespace kiln
"""
