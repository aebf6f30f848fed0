"""bfloat16 and float16 in generated C++: how they are stored, converted and rounded.

A buffer of either dtype holds its 16 bits (`kiln_bfloat16` / `kiln_float16`, both `uint16_t`:
any C++17 compiler, no `__bf16`/`_Float16` support needed). A value of either dtype lives in a
`float` register holding a number the dtype represents exactly, which is what loopir's rule asks
(loads upcast to float32, math in float32, rounding to the storage dtype on store): loading
widens the bits, `to_dtype` rounds the float in place (`kiln_round_bf16`), and storing narrows
the float to 16 bits. Ops that are exact on such values (compares, where, max/min, neg, abs)
need nothing more; loopir computes the others in float32.

The conversions are integer bit operations and selects, no branches and no libm call, so GCC
vectorizes the scalar loops that use them; the vector layer (`vector_layer.py`) has the same
conversions written on its vector types. Both round to nearest, ties to even; overflow gives
+-inf, float16 keeps subnormals, and a NaN stays a quiet NaN with its sign and the top bits of
its payload (as x86's F16C conversion does; torch's own CPU kernels give 0xffff or 0x7fc0 for
every bfloat16 NaN). Conversions from float64 or integers go through float32 first, as torch's
do (`c10::BFloat16` and `c10::Half` are built from a float).
"""

from __future__ import annotations

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)
# The suffix of a dtype's conversion functions (kiln_round_bf16, kiln::f32_to_fp16, ...).
SUFFIX = {torch.bfloat16: "bf16", torch.float16: "fp16"}
STORAGE_TYPES = {torch.bfloat16: "kiln_bfloat16", torch.float16: "kiln_float16"}

SCALAR_CONVERSIONS = r"""
// bfloat16 / float16: stored as their 16 bits, computed in float (see low_precision.py).
typedef uint16_t kiln_bfloat16;
typedef uint16_t kiln_float16;
static inline uint32_t kiln_float_bits(float x) { uint32_t u; std::memcpy(&u, &x, sizeof u); return u; }
static inline float kiln_bits_float(uint32_t u) { float x; std::memcpy(&x, &u, sizeof x); return x; }
static inline float kiln_bf16_to_float(kiln_bfloat16 h) { return kiln_bits_float(uint32_t(h) << 16); }
// x's float32 bits with the low 16 rounded off (to nearest even; a NaN made quiet).
static inline uint32_t kiln_bf16_bits(float x) {
    uint32_t u = kiln_float_bits(x);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    uint32_t nan = (u | 0x400000u) & 0xffff0000u;
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}
static inline kiln_bfloat16 kiln_float_to_bf16(float x) { return kiln_bfloat16(kiln_bf16_bits(x) >> 16); }
static inline float kiln_round_bf16(float x) { return kiln_bits_float(kiln_bf16_bits(x)); }
static inline float kiln_fp16_to_float(kiln_float16 h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16, rest = h & 0x7fffu;
    uint32_t normal = (rest << 13) + 0x38000000u;  // exponent bias 15 -> 127
    uint32_t special = (rest << 13) | 0x7f800000u;  // inf, NaN
    uint32_t subnormal = kiln_float_bits(float(int32_t(rest)) * 5.9604644775390625e-08f);  // rest * 2^-24, exact
    return kiln_bits_float(sign | (rest >= 0x7c00u ? special : (rest >= 0x0400u ? normal : subnormal)));
}
static inline kiln_float16 kiln_float_to_fp16(float x) {
    uint32_t u = kiln_float_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    // |x| >= 2^-14: drop 13 mantissa bits to nearest even, exponent bias 127 -> 15.
    uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    // |x| < 2^-14: 0.5f + |x| rounds |x| to a multiple of 2^-24 (the float16 subnormal step),
    // to nearest even, in the FPU; its low bits are then the float16 bits.
    uint32_t subnormal = kiln_float_bits(kiln_bits_float(a) + 0.5f) - 0x3f000000u;
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    // 65520 (0x477ff000) and above round to inf.
    uint32_t magnitude = a > 0x7f800000u ? nan : (a >= 0x477ff000u ? 0x7c00u : (a >= 0x38800000u ? normal : subnormal));
    return kiln_float16(sign | magnitude);
}
static inline float kiln_round_fp16(float x) { return kiln_fp16_to_float(kiln_float_to_fp16(x)); }
"""

VECTOR_CONVERSIONS = r"""
// ---- bfloat16 / float16 vectors: 16-bit lanes in memory, float32 lanes in registers ----
namespace kiln {
typedef uint16_t vu16 __attribute__((vector_size(KILN_LANES * 2)));
typedef uint32_t vu32 __attribute__((vector_size(KILN_LANES * 4)));
static inline vu16 load(const uint16_t* p) { return load_as<vu16>(p); }
static inline vu16 load(const uint16_t* p, int64_t n) { return load_as<vu16>(p, n); }

// 16-bit lanes zero-extended to 32 (GCC 12 splits the AVX-512 conversion in four instructions)
static inline vu32 widen_u16(vu16 h) {
#if defined(__AVX512F__) && KILN_VECTOR_BYTES == 64
    return (vu32)_mm512_cvtepu16_epi32((__m256i)h);
#else
    return __builtin_convertvector(h, vu32);
#endif
}
static inline vf32 bf16_to_f32(vu16 h) { return (vf32)(widen_u16(h) << 16); }
static inline vu32 bf16_bits(vf32 x) {  // as the scalar kiln_bf16_bits
    vu32 u = (vu32)x;
    vu32 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    vu32 nan = (u | 0x400000u) & 0xffff0000u;
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}
static inline vu16 f32_to_bf16(vf32 x) { return __builtin_convertvector(bf16_bits(x) >> 16, vu16); }
static inline vf32 round_bf16(vf32 x) { return (vf32)bf16_bits(x); }

static inline vf32 fp16_to_f32(vu16 h) {  // as the scalar kiln_fp16_to_float
    vu32 w = widen_u16(h);
    vu32 sign = (w & 0x8000u) << 16, rest = w & 0x7fffu;
    vu32 normal = (rest << 13) + 0x38000000u;
    vu32 special = (rest << 13) | 0x7f800000u;
    vu32 subnormal = (vu32)(__builtin_convertvector((vi32)rest, vf32) * 5.9604644775390625e-08f);
    return (vf32)(sign | (rest >= 0x7c00u ? special : (rest >= 0x0400u ? normal : subnormal)));
}
static inline vu16 f32_to_fp16(vf32 x) {  // as the scalar kiln_float_to_fp16
    vu32 u = (vu32)x, sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    vu32 normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    vu32 subnormal = (vu32)((vf32)a + 0.5f) - 0x3f000000u;
    vu32 nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    vu32 magnitude = a > 0x7f800000u ? nan : (a >= 0x477ff000u ? splat<vu32>(0x7c00u)
                                                                : (a >= 0x38800000u ? normal : subnormal));
    return __builtin_convertvector(sign | magnitude, vu16);
}
static inline vf32 round_fp16(vf32 x) { return fp16_to_f32(f32_to_fp16(x)); }
}  // namespace kiln
"""


def from_storage(dtype: torch.dtype, element: str) -> str:
    """C++ for the float value of a stored bfloat16/float16 `element` (scalar)."""
    return f"kiln_{SUFFIX[dtype]}_to_float({element})"


def to_storage(dtype: torch.dtype, value: str) -> str:
    """C++ for the 16 bits a float (or any arithmetic) scalar `value` is stored as."""
    return f"kiln_float_to_{SUFFIX[dtype]}({value})"


def round_to(dtype: torch.dtype, value: str) -> str:
    """C++ for scalar `value` rounded to `dtype`, as a float."""
    return f"kiln_round_{SUFFIX[dtype]}({value})"


def vector_from_storage(dtype: torch.dtype, bits: str) -> str:
    return f"kiln::{SUFFIX[dtype]}_to_f32({bits})"


def vector_to_storage(dtype: torch.dtype, value: str) -> str:
    return f"kiln::f32_to_{SUFFIX[dtype]}({value})"


def vector_round_to(dtype: torch.dtype, value: str) -> str:
    return f"kiln::round_{SUFFIX[dtype]}({value})"
