"""kiln's vector math on float64 registers (C++ on the SIMD layer, `vector_layer.py`): the
float64 functions, and the float32 functions that are evaluated in float64 and rounded once
(`vector_math.py` says which, and the accuracy of each).

Written for one register of doubles, `D`: a `vf64` holds KILN_LANES doubles, two registers
where a float32 vector fills one, and GCC splits compares and selects on a two-register vector
lane by lane, so `per_register` runs each function on one register at a time.
"""

from __future__ import annotations

VECTOR_MATH_FLOAT64 = r"""
// ---- kiln's float64 vector math (accuracy: kiln/codegen_cpp/_internal/vector_math.py) ----
namespace kiln {
template <typename D> using mask_of = decltype(std::declval<D>() < std::declval<D>());
template <typename V, typename S, size_t N> static inline V horner(V x, const S (&c)[N]) {
    V p = splat<V>(c[0]);
    // unrolled, so every coefficient is a constant (GCC kept a loop loading them otherwise)
#pragma GCC unroll 32
    for (size_t k = 1; k < N; ++k) p = fma(p, x, splat<V>(c[k]));
    return p;
}
template <typename M> static inline bool any_lane(M m) {
    int64_t r = 0;
    for (size_t k = 0; k < sizeof(M) / sizeof(m[0]); ++k) r |= m[k];
    return r != 0;
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

// exp(r) for |r| <= ln2/2 (degree-13 Taylor polynomial), and y * 2^n in two scalings (2^n
// alone may not be a normal number).
template <typename D> static inline D exp_reduced_d(D r) {
    static const double taylor[] = {1.0 / 6227020800, 1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800,
                                    1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120,
                                    1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0};
    return horner(r, taylor);
}
template <typename D> static inline D scale_d(D y, D n) {
    mask_of<D> k = __builtin_convertvector(n, mask_of<D>), half = k >> 1;
    return y * pow2_d<D>(half) * pow2_d<D>(k - half);
}

template <typename D> static inline D exp_d(D x) {
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    D t = x * 1.4426950408889634;
    t = t > 1100 ? splat<D>(1100) : t;
    t = t < -1100 ? splat<D>(-1100) : t;
    D n = round_to_int(t);
    D r = fma(n, splat<D>(-ln2_lo), fma(n, splat<D>(-ln2_hi), x));
    D y = scale_d(exp_reduced_d(r), n);
    y = x > 709.782712893384 ? splat<D>(__builtin_inf()) : y;
    y = x < -745.2 ? D{} : y;
    return x != x ? x : y;
}

template <typename D> static inline D exp2_d(D x) {
    D c = x > 1100 ? splat<D>(1100) : x;
    c = c < -1100 ? splat<D>(-1100) : c;
    D n = round_to_int(c);
    D y = scale_d(exp_reduced_d((c - n) * 0.6931471805599453), n);  // c - n is exact
    y = x >= 1024 ? splat<D>(__builtin_inf()) : y;
    y = x < -1075 ? D{} : y;
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

// x = 2^e * m, m in [sqrt(1/2), sqrt(2)): returns log(m) (2 atanh((m-1)/(m+1)) series) and e.
template <typename D> static inline D log_mantissa_d(D x, D& e) {
    using L = mask_of<D>;
    static const double atanh_series[] = {2.0 / 23, 2.0 / 21, 2.0 / 19, 2.0 / 17, 2.0 / 15, 2.0 / 13,
                                          2.0 / 11, 2.0 / 9, 2.0 / 7, 2.0 / 5, 2.0 / 3, 2.0};
    L subnormal = x < 2.2250738585072014e-308;
    D scaled = subnormal ? x * 18014398509481984.0 : x;  // 2^54
    L bits = (L)scaled;
    e = __builtin_convertvector(((bits >> 52) & 0x7ff) - 1023 - (subnormal & 54), D);
    D m = (D)((bits & 0x000fffffffffffffL) | 0x3ff0000000000000L);  // in [1, 2)
    L high = m > 1.4142135623730951;
    m = high ? m * 0.5 : m;
    e = high ? e + 1 : e;
    D s = (m - 1) / (m + 1);
    return s * horner(s * s, atanh_series);
}
template <typename D> static inline D log_special_d(D x, D y) {  // log's value at 0, inf, < 0, NaN
    y = x == 0 ? splat<D>(-__builtin_inf()) : y;
    y = x == __builtin_inf() ? x : y;
    return ((x < 0) | (x != x)) ? splat<D>(__builtin_nan("")) : y;
}
template <typename D> static inline D log_d(D x) {
    const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
    D e;
    D lm = log_mantissa_d(x, e);
    return log_special_d(x, fma(e, splat<D>(ln2_hi), fma(e, splat<D>(ln2_lo), lm)));
}
template <typename D> static inline D log2_d(D x) {
    D e;
    D lm = log_mantissa_d(x, e);
    return log_special_d(x, fma(lm, splat<D>(1.4426950408889634), e));  // exact at powers of 2
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

// sin (quadrant 0) or cos (quadrant 1): x = n pi/2 + r, |r| <= pi/4 (Cody-Waite with pi/2 in
// three 33-bit parts: exact for |n| < 2^20), fdlibm's kernel polynomials. Lanes beyond
// 1.6e6 (and inf) take libm's sin/cos (a rare case, outside the hot path).
template <typename D> static inline D sin_cos_d(D x, int quadrant) {
    using L = mask_of<D>;
    const double p1 = 1.57079632673412561417e+00, p2 = 6.07710050630396597660e-11, p3 = 2.02226624871116645580e-21;
    static const double s[] = {1.58969099521155010221e-10, -2.50507602534068634195e-08, 2.75573137070700676789e-06,
                               -1.98412698298579493134e-04, 8.33333333332248946124e-03, -1.66666666666666324348e-01};
    static const double c[] = {-1.13596475577881948265e-11, 2.08757232129817482790e-09, -2.75573143513906633035e-07,
                               2.48015872894767294178e-05, -1.38888888888741095749e-03, 4.16666666666666019037e-02};
    L huge = abs_d(x) > 1.6e6;
    D inside = huge ? D{} : x;
    D n = round_to_int(inside * 0.63661977236758134308);
    D r = fma(n, splat<D>(-p3), fma(n, splat<D>(-p2), fma(n, splat<D>(-p1), inside)));
    D z = r * r, hz = 0.5 * z, w = 1 - hz;
    D sin_r = fma(r * z, horner(z, s), r);
    D cos_r = w + (((1 - w) - hz) + z * z * horner(z, c));
    L q = __builtin_convertvector(n, L) + quadrant;
    D y = (q & 1) != 0 ? cos_r : sin_r;
    y = (q & 2) != 0 ? -y : y;
    if (quadrant == 0) y = x == 0 ? x : y;  // sin keeps -0
    if (__builtin_expect(any_lane(huge), 0)) {
        for (size_t k = 0; k < sizeof(D) / sizeof(double); ++k) {
            if (huge[k]) y[k] = quadrant ? std::cos(x[k]) : std::sin(x[k]);
        }
    }
    return y;
}
template <typename D> static inline D sin_d(D x) { return sin_cos_d(x, 0); }
template <typename D> static inline D cos_d(D x) { return sin_cos_d(x, 1); }

// pow as exp(y log|x|) with C99's special cases (accurate enough for float32 results only:
// the product's rounding error is scaled by |y log|x||).
template <typename D> static inline D pow_d(D x, D y) {
    using L = mask_of<D>;
    D r = exp_d(y * log_d(abs_d(x)));
    L integer = y == round_to_int(y) | abs_d(y) >= 4503599627370496.0;  // 2^52: every such double is an integer
    D half = y * 0.5;
    L odd = integer & (abs_d(y) < 9007199254740992.0) & (half != round_to_int(half));
    L negative = (L)x < 0;  // also -0 and -inf
    r = (negative & odd) != 0 ? -r : r;
    L finite_negative = (x < 0) & (x != -__builtin_inf());
    r = (finite_negative & ~integer & (abs_d(y) != __builtin_inf())) != 0 ? splat<D>(__builtin_nan("")) : r;
    r = (x == -1) & (abs_d(y) == __builtin_inf()) ? splat<D>(1) : r;
    return (y == 0) | (x == 1) ? splat<D>(1) : r;
}

#if KILN_LANES == 1  // one lane: the vf64 is the register (vd, vector_layer.py)
template <typename F> static inline vf64 per_register(vf64 x, F f) { return f(x); }
template <typename F> static inline vf64 per_register(vf64 x, vf64 y, F f) { return f(x, y); }
#else
template <typename F> static inline vf64 per_register(vf64 x, F f) {
    vd half[2];
    std::memcpy(half, &x, sizeof(x));
    half[0] = f(half[0]);
    half[1] = f(half[1]);
    std::memcpy(&x, half, sizeof(x));
    return x;
}
template <typename F> static inline vf64 per_register(vf64 x, vf64 y, F f) {
    vd a[2], b[2];
    std::memcpy(a, &x, sizeof(x));
    std::memcpy(b, &y, sizeof(y));
    a[0] = f(a[0], b[0]);
    a[1] = f(a[1], b[1]);
    std::memcpy(&x, a, sizeof(x));
    return x;
}
#endif
#define KILN_FLOAT64_MATH(name)                                                                     \
    static inline vf64 name(vf64 x) { return per_register(x, [](vd h) { return name##_d(h); }); }
KILN_FLOAT64_MATH(exp)
KILN_FLOAT64_MATH(exp2)
KILN_FLOAT64_MATH(expm1)
KILN_FLOAT64_MATH(log)
KILN_FLOAT64_MATH(log2)
KILN_FLOAT64_MATH(log1p)
KILN_FLOAT64_MATH(tanh)
KILN_FLOAT64_MATH(sigmoid)
KILN_FLOAT64_MATH(sin)
KILN_FLOAT64_MATH(cos)
#undef KILN_FLOAT64_MATH
}  // namespace kiln
"""
