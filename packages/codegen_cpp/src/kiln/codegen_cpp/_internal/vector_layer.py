"""kiln's own SIMD layer: the C++ vector types, loads/stores, masks and lane-wise helpers that
vectorized loops (`vector_source.py`) are written in, and the vector math (`vector_math.py`).

Vectors are GCC/Clang vector extensions (`__attribute__((vector_size(N)))`), so the same
source compiles for any host: the width comes from the ISA the compiler targets
(`-march=native`): 64 bytes with AVX-512, 32 with AVX/AVX2, 16 with SSE2 or NEON, and 4 bytes
(one float lane: plain scalar code) otherwise. ``-DKILN_VECTOR_BYTES=N`` overrides it (tests
compile every width on one host). Every vector type has the same number of lanes,
`KILN_LANES` (the float32 lanes of one register), so one loop iteration handles KILN_LANES
elements of any dtype: a float64 or int64 vector spans two registers, which the compiler
splits (arithmetic well; compares and selects lane by lane, so the float64 math in
`vector_math.py` runs one register at a time, and float64/int64 compares in generated code
are slower than they should be: a known cost). A bool vector (`vmask`) is an int32 vector holding 0 or -1 per lane, what a float32
compare yields; wider compares are narrowed with `kiln::mask`.
"""

from __future__ import annotations

VECTOR_LAYER = r"""
// ---- kiln's SIMD layer: vector types sized for the target ISA ----
#include <cstring>
#include <type_traits>
#include <utility>
#if defined(__SSE2__)
#include <immintrin.h>
#endif
#ifndef KILN_VECTOR_BYTES
#if defined(__AVX512F__)
#define KILN_VECTOR_BYTES 64
#elif defined(__AVX__)
#define KILN_VECTOR_BYTES 32
#elif defined(__SSE2__) || defined(__ARM_NEON) || defined(__aarch64__)
#define KILN_VECTOR_BYTES 16
#else
#define KILN_VECTOR_BYTES 4  // no SIMD: one lane, plain scalar code
#endif
#endif
#define KILN_LANES (KILN_VECTOR_BYTES / 4)

namespace kiln {
typedef float vf32 __attribute__((vector_size(KILN_LANES * 4)));
typedef double vf64 __attribute__((vector_size(KILN_LANES * 8)));
typedef int32_t vi32 __attribute__((vector_size(KILN_LANES * 4)));
typedef int64_t vi64 __attribute__((vector_size(KILN_LANES * 8)));
typedef uint8_t vu8 __attribute__((vector_size(KILN_LANES)));  // bool as stored in memory
typedef vi32 vmask;  // bool: 0 or -1 per lane

// Where a loop's vector iterations end and its scalar tail begins.
static inline int64_t vector_end(int64_t n) { return n - n % KILN_LANES; }

// Unaligned loads and stores (memcpy compiles to one vector move).
template <typename V, typename T> static inline V load_as(const T* p) { V v; std::memcpy(&v, p, sizeof(V)); return v; }
static inline vf32 load(const float* p) { return load_as<vf32>(p); }
static inline vf64 load(const double* p) { return load_as<vf64>(p); }
static inline vi32 load(const int32_t* p) { return load_as<vi32>(p); }
static inline vi64 load(const int64_t* p) { return load_as<vi64>(p); }
static inline vmask load(const bool* p) { return __builtin_convertvector(load_as<vu8>(p), vi32) != 0; }
template <typename T, typename V> static inline void store(T* p, V v) { std::memcpy(p, &v, sizeof(V)); }
static inline void store(bool* p, vmask m) { store(p, __builtin_convertvector(m & 1, vu8)); }
// The first n < KILN_LANES elements (a loop's tail); the other lanes load as 0 and are not stored.
template <typename V, typename T> static inline V load_as(const T* p, int64_t n) {
    V v{};
    std::memcpy(&v, p, n * sizeof(T));
    return v;
}
static inline vf32 load(const float* p, int64_t n) { return load_as<vf32>(p, n); }
static inline vf64 load(const double* p, int64_t n) { return load_as<vf64>(p, n); }
static inline vi32 load(const int32_t* p, int64_t n) { return load_as<vi32>(p, n); }
static inline vi64 load(const int64_t* p, int64_t n) { return load_as<vi64>(p, n); }
static inline vmask load(const bool* p, int64_t n) { return __builtin_convertvector(load_as<vu8>(p, n), vi32) != 0; }
template <typename T, typename V> static inline void store(T* p, V v, int64_t n) { std::memcpy(p, &v, n * sizeof(T)); }
static inline void store(bool* p, vmask m, int64_t n) { store(p, __builtin_convertvector(m & 1, vu8), n); }
// A streaming store (`stream_stores.py`): full, aligned float32 vectors go around the cache (no
// read of the line first); anything else is an ordinary store. `stream_fence` orders them.
template <typename T, typename V> static inline void store_stream(T* p, V v, int64_t n) {
    if constexpr (std::is_same_v<T, float> && std::is_same_v<V, vf32>) {
        if (n == KILN_LANES && reinterpret_cast<uintptr_t>(p) % sizeof(V) == 0) {
#if defined(__AVX512F__) && KILN_VECTOR_BYTES == 64
            _mm512_stream_ps(p, (__m512)v);
            return;
#elif defined(__AVX__) && KILN_VECTOR_BYTES == 32
            _mm256_stream_ps(p, (__m256)v);
            return;
#elif defined(__SSE2__) && KILN_VECTOR_BYTES == 16
            _mm_stream_ps(p, (__m128)v);
            return;
#endif
        }
    }
    store(p, v, n);
}
static inline void stream_fence() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

// Elements p[0], p[stride], ..., of which the first n are read (a transposed read).
template <typename T> static inline auto load_strided(const T* p, int64_t stride, int64_t n) {
    T lanes[KILN_LANES] = {};
    for (int64_t k = 0; k < n; ++k) lanes[k] = p[k * stride];
    return load(lanes);
}

// Stores the first n lanes of v at p[0], p[stride], ... (a transposed write).
template <typename T, typename V> static inline void store_strided(T* p, int64_t stride, V v, int64_t n) {
    T lanes[KILN_LANES];
    store(lanes, v);
    for (int64_t k = 0; k < n; ++k) p[k * stride] = lanes[k];
}

// A loop-invariant scalar in every lane; lane k of a ramp is start + k * step.
// (A braced list of KILN_LANES copies: one broadcast instruction; `V{} + s` would be an add,
// which GCC may not fold away since +0 + -0 is +0.)
template <typename V, typename E, size_t... lane> static inline V splat_lanes(E s, std::index_sequence<lane...>) {
    return V{((void)lane, s)...};
}
template <typename V, typename S> static inline V splat(S s) {
    using E = std::remove_reference_t<decltype(std::declval<V>()[0])>;
    return splat_lanes<V>(static_cast<E>(s), std::make_index_sequence<sizeof(V) / sizeof(E)>{});
}
template <typename V> static inline V ramp(int64_t start, int64_t step) {
    using E = std::remove_reference_t<decltype(std::declval<V>()[0])>;
    V v;
    for (int k = 0; k < KILN_LANES; ++k) v[k] = static_cast<E>(start + k * step);
    return v;
}

static inline vf32 narrow(vf64 x) { return __builtin_convertvector(x, vf32); }
static inline vf64 widen(vf32 x) { return __builtin_convertvector(x, vf64); }

// A vf64 spans two registers, and GCC keeps such a vector (no machine mode of its size) in
// memory: a float32 sum's float64 accumulator would be stored and reloaded on every add. So
// hot float64 work on float32 data runs on the halves: `vd` is one register of doubles, `vf64x2`
// a vf32's lanes as two of them (low lanes, high lanes).
#if KILN_LANES == 1
typedef vf64 vd;  // one lane: the vf64 is the register
typedef vf64 vf64x2;
static inline vf64x2 widen2(vf32 x) { return widen(x); }
template <typename F> static inline vf32 in_float64(vf32 x, F f) { return narrow(f(widen(x))); }
template <typename F> static inline vf32 in_float64(vf32 x, vf32 y, F f) { return narrow(f(widen(x), widen(y))); }
#else
typedef double vd __attribute__((vector_size(KILN_VECTOR_BYTES)));
typedef float vf32_half __attribute__((vector_size(KILN_VECTOR_BYTES / 2)));
struct vf64x2 { vd lo, hi; };
static inline vf64x2 operator+(vf64x2 a, vf64x2 b) { return {a.lo + b.lo, a.hi + b.hi}; }
#if defined(__AVX512F__) && KILN_VECTOR_BYTES == 64
// GCC 12 converts 8 floats to 8 doubles in four instructions, the ISA in one
static inline vd to_float64(vf32_half h) { return (vd)_mm512_cvtps_pd((__m256)h); }
#else
static inline vd to_float64(vf32_half h) { return __builtin_convertvector(h, vd); }
#endif
static inline vf64x2 widen2(vf32 x) {
    vf32_half half[2];
    std::memcpy(half, &x, sizeof(x));
    return {to_float64(half[0]), to_float64(half[1])};
}
static inline vf32 narrow(vf64x2 x) {
    vf32_half half[2] = {__builtin_convertvector(x.lo, vf32_half), __builtin_convertvector(x.hi, vf32_half)};
    vf32 v;
    std::memcpy(&v, half, sizeof(v));
    return v;
}
// f (a function of vd) on the lanes of a float32 vector, evaluated in float64, rounded once.
template <typename F> static inline vf32 in_float64(vf32 x, F f) {
    vf64x2 w = widen2(x);
    return narrow(vf64x2{f(w.lo), f(w.hi)});
}
template <typename F> static inline vf32 in_float64(vf32 x, vf32 y, F f) {
    vf64x2 a = widen2(x), b = widen2(y);
    return narrow(vf64x2{f(a.lo, b.lo), f(a.hi, b.hi)});
}
#endif

// Masks: compares of 8-byte lanes narrowed to vmask; widened again to select 8-byte lanes.
static inline vmask mask(vi32 m) { return m; }
static inline vmask mask(vi64 m) { return __builtin_convertvector(m, vi32); }
template <typename V> static inline V from_mask(vmask m) { return __builtin_convertvector(m & 1, V); }
static inline vf32 select(vmask m, vf32 a, vf32 b) { return m ? a : b; }
static inline vi32 select(vmask m, vi32 a, vi32 b) { return m ? a : b; }
static inline vf64 select(vmask m, vf64 a, vf64 b) { return __builtin_convertvector(m, vi64) ? a : b; }
static inline vi64 select(vmask m, vi64 a, vi64 b) { return __builtin_convertvector(m, vi64) ? a : b; }

// Same semantics as the scalar kiln_max/kiln_min/kiln_relu: NaN propagates.
template <typename V> static inline V maximum(V a, V b) { return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); }
template <typename V> static inline V minimum(V a, V b) { return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); }
template <typename V> static inline V relu(V x) { return x < 0 ? V{} : x; }
static inline vf32 abs(vf32 x) { return (vf32)((vi32)x & 0x7fffffff); }
static inline vf64 abs(vf64 x) { return (vf64)((vi64)x & 0x7fffffffffffffffL); }
static inline vi32 abs(vi32 x) { return x < 0 ? -x : x; }
static inline vi64 abs(vi64 x) { return x < 0 ? -x : x; }
static inline vf32 copysign(vf32 x, vf32 s) { return (vf32)(((vi32)abs(x)) | ((vi32)s & int32_t(0x80000000u))); }
static inline vf64 copysign(vf64 x, vf64 s) {
    return (vf64)(((vi64)abs(x)) | ((vi64)s & int64_t(0x8000000000000000uL)));
}

// One instruction per lane on every SIMD ISA (sqrt, round): a fixed-count loop over the lanes
// of a vector, which GCC and Clang turn into the vector instruction (no libm call is made:
// -fno-math-errno).
#define KILN_LANEWISE(name, f32, f64)                                                            \
    static inline vf32 name(vf32 x) { for (int k = 0; k < KILN_LANES; ++k) x[k] = f32(x[k]); return x; } \
    static inline vf64 name(vf64 x) { for (int k = 0; k < KILN_LANES; ++k) x[k] = f64(x[k]); return x; }
KILN_LANEWISE(sqrt, __builtin_sqrtf, __builtin_sqrt)
KILN_LANEWISE(floor, __builtin_floorf, __builtin_floor)
KILN_LANEWISE(ceil, __builtin_ceilf, __builtin_ceil)
KILN_LANEWISE(trunc, __builtin_truncf, __builtin_trunc)
KILN_LANEWISE(round_even, __builtin_rintf, __builtin_rint)
#undef KILN_LANEWISE
// Reductions: lanes at or past `active` (a tail's missing elements) hold the identity `fill`;
// the horizontal folds run in lane order (sum: in the accumulator's type).
template <typename V, typename S> static inline V active_or(V v, S fill, int64_t active) {
    return select(ramp<vi32>(0, 1) < int32_t(active), v, splat<V>(fill));
}
// The horizontal folds run as a tree: lane k with lane k + w, w = KILN_LANES / 2, ..., 1, as
// vector ops on halves (log2(KILN_LANES) steps; a lane loop here stayed a loop through memory).
template <typename V, typename C> static inline auto fold_lanes(V v, C combine) {
    constexpr size_t n = sizeof(V) / sizeof(v[0]);
    if constexpr (n == 1) {
        return v[0];
    } else {
        using E = std::remove_reference_t<decltype(v[0])>;
        typedef E half_t __attribute__((vector_size(sizeof(V) / 2)));
        half_t half[2];
        std::memcpy(half, &v, sizeof(v));
        return fold_lanes(combine(half[0], half[1]), combine);
    }
}
template <typename V> static inline auto reduce_add(V v) { return fold_lanes(v, [](auto a, auto b) { return a + b; }); }
template <typename V> static inline auto reduce_mul(V v) { return fold_lanes(v, [](auto a, auto b) { return a * b; }); }
template <typename V> static inline auto reduce_or(V v) { return fold_lanes(v, [](auto a, auto b) { return a | b; }); }
template <typename V> static inline auto reduce_and(V v) { return fold_lanes(v, [](auto a, auto b) { return a & b; }); }
template <typename V> static inline auto reduce_max(V v) { return fold_lanes(v, [](auto a, auto b) { return maximum(a, b); }); }
template <typename V> static inline auto reduce_min(V v) { return fold_lanes(v, [](auto a, auto b) { return minimum(a, b); }); }
#if KILN_LANES > 1
static inline double reduce_add(vf64x2 v) { return reduce_add(v.lo + v.hi); }  // the tree's first step
#endif
// The total of a float32 row sum (vector_reduction_source.py), which its float32 partials move
// into every few iterations: float32 lanes where the row is short (few values reach a lane, so
// few roundings: `short_row` is a compile-time condition on KILN_LANES), float64 otherwise.
// reduce_add folds either (the float32 one in float32).
template <bool short_row> using sum_total = std::conditional_t<short_row, vf32, vf64x2>;
static inline vf32 add_partials(vf32 total, vf32 partials) { return total + partials; }
static inline vf64x2 add_partials(vf64x2 total, vf32 partials) { return total + widen2(partials); }
// Lane-wise larger/smaller for folding accumulators (their NaNs are tracked apart).
template <typename V> static inline V larger(V a, V b) { return a > b ? a : b; }
template <typename V> static inline V smaller(V a, V b) { return a < b ? a : b; }

// argmax/argmin per lane: `best` and its position `at`. A strictly better value, or a NaN
// where best is not one, replaces them (positions arrive in increasing order per lane).
template <bool largest, typename V> static inline vmask arg_better(V v, V best) {
    if constexpr (largest) return mask((v > best) | ((v != v) & (best == best)));
    else return mask((v < best) | ((v != v) & (best == best)));
}
template <bool largest, typename V> static inline void arg_update(V& best, vi64& at, V v, vi64 position) {
    vmask take = arg_better<largest>(v, best);
    best = select(take, v, best);
    at = select(take, position, at);
}
// Two candidates of the same lanes: the better value; on a tie (equal, or both NaN) the lower position.
template <bool largest, typename V> static inline void arg_combine(V& best, vi64& at, V other, vi64 other_at) {
    vmask same = mask((other == best) | ((other != other) & (best != best)));
    vmask take = arg_better<largest>(other, best) | (same & mask(other_at < at));
    best = select(take, other, best);
    at = select(take, other_at, at);
}
template <bool largest, typename V> static inline int64_t arg_fold(V best, vi64 at) {
    auto b = best[0];
    int64_t a = at[0];
    for (int k = 1; k < KILN_LANES; ++k) {
        auto v = best[k];
        bool better = (largest ? v > b : v < b) || (v != v && b == b);
        bool same = v == b || (v != v && b != b);
        if (better || (same && at[k] < a)) {
            b = v;
            a = at[k];
        }
    }
    return a;
}
template <typename V> static inline V rsqrt(V x) { return 1 / sqrt(x); }

// a * b + c rounded once where the ISA has fused multiply-add (one instruction per vector: a
// fixed-count lane loop GCC turns into vfmadd), a * b + c otherwise: vector_math.py's bounds
// hold both ways (its tests compile both). Works on any vector type, of float or double.
template <typename V> static inline V fma(V a, V b, V c) {
#if defined(__FMA__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
    constexpr int n = sizeof(V) / sizeof(a[0]);
    for (int k = 0; k < n; ++k) a[k] = std::fma(a[k], b[k], c[k]);
    return a;
#else
    return a * b + c;
#endif
}
// Any/every lane of a mask set (a rare-case branch: both fold the lanes).
static inline bool any(vmask m) {
    int32_t r = 0;
    for (int k = 0; k < KILN_LANES; ++k) r |= m[k];
    return r != 0;
}
template <typename V> static inline V reciprocal(V x) { return 1 / x; }
}  // namespace kiln
"""
