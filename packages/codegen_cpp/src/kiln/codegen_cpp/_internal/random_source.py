"""C++ for loopir's random-number ops (`rand`, `randn`, `randint64`): kiln's Philox4x32-10,
exactly as `kiln/loopir/_internal/philox.py` defines it, so the C++ codegen draws the numbers
the reference evaluator and the Triton codegen draw (the integers and `rand` bit for bit).

The functions are `static inline` and branch-free apart from the fixed round loop, which GCC
unrolls; a translation unit includes them only when one of its kernels draws numbers.
"""

from __future__ import annotations

from kiln.loopir.codegen import philox

TEMPLATES = {
    "rand": "kiln_rand({0}, {1})",
    "randn": "kiln_randn({0}, {1})",
    "randint64": "kiln_randint64({0}, {1}, {2}, {3})",
}

SOURCE = f"""
// kiln's random numbers: Philox4x32-10, key = the 64-bit seed, counter = (offset, 0, 0)
// (kiln/loopir/_internal/philox.py defines them; every codegen draws the same numbers).
struct kiln_philox_words {{ uint32_t c0, c1, c2, c3; }};

static inline kiln_philox_words kiln_philox(int64_t seed, int64_t offset) {{
    uint32_t k0 = (uint32_t)(uint64_t)seed, k1 = (uint32_t)((uint64_t)seed >> 32);
    uint32_t c0 = (uint32_t)(uint64_t)offset, c1 = (uint32_t)((uint64_t)offset >> 32), c2 = 0, c3 = 0;
    for (int round = 0; round < {philox.ROUNDS}; ++round) {{
        uint64_t p1 = (uint64_t){philox.M1:#x}u * c2, p0 = (uint64_t){philox.M0:#x}u * c0;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0; c1 = (uint32_t)p1; c2 = n2; c3 = (uint32_t)p0;
        k0 += {philox.W0:#x}u; k1 += {philox.W1:#x}u;
    }}
    return {{c0, c1, c2, c3}};
}}

static inline float kiln_uniform(uint32_t word) {{
    uint32_t x = word >= 0x80000000u ? word ^ 0xffffffffu : word;  // int32's ~x where negative
    return (float)(int32_t)x * {philox.UNIFORM_SCALE!r}f;
}}

static inline float kiln_rand(int64_t seed, int64_t offset) {{
    return kiln_uniform(kiln_philox(seed, offset).c0);
}}

static inline float kiln_randn(int64_t seed, int64_t offset) {{
    kiln_philox_words w = kiln_philox(seed, offset);
    float u1 = std::max(kiln_uniform(w.c0), {philox.MIN_UNIFORM!r}f);
    float angle = {philox.TWO_PI!r}f * kiln_uniform(w.c1);
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(angle);
}}

static inline int64_t kiln_randint64(int64_t seed, int64_t offset, int64_t low, int64_t high) {{
    kiln_philox_words w = kiln_philox(seed, offset);
    int64_t bits = (int64_t)(((uint64_t)(w.c1 & 0x7fffffffu) << 32) | w.c0);
    return low + bits % (high - low);
}}
"""


def uses_random(source: str) -> bool:
    """Whether generated kernel text calls one of the functions above."""
    return any(template.split("(")[0] + "(" in source for template in TEMPLATES.values())
