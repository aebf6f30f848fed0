"""kiln's vector math meets its stated ulp bounds (the table in `_internal/vector_math.py`).

Every function of one dtype is compiled into one pointwise kernel graph, so every element goes
through the vector code (the tail as a partial vector), and swept over dense ranges, 200k
random bit patterns (every magnitude, denormals, NaNs) and the special values; once with
fused multiply-add and once without (-mno-fma: the `a * b + c` path of `kiln::fma`). float32
results are compared with the float64 result rounded to float32; float64 results with torch's
float64.
"""

from __future__ import annotations

import math
import subprocess

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, loopir

# function -> (torch function, dense ranges swept, float32 bound, float64 bound or None: scalar)
FUNCTIONS = {
    "exp": (torch.exp, [(-110, 90)], 1, 1),
    "exp2": (torch.exp2, [(-155, 130), (-1, 1)], 1, 1),
    "expm1": (torch.expm1, [(-20, 90), (-1e-3, 1e-3)], 1, 3),
    "log": (torch.log, [(0, 1e6), (0, 2)], 2, 3),
    "log2": (torch.log2, [(0, 1e6), (0, 2)], 1, 3),
    "log1p": (torch.log1p, [(-1, 100), (-1e-3, 1e-3)], 1, 4),
    "tanh": (torch.tanh, [(-12, 12), (-1e-3, 1e-3)], 2, 3),
    "sigmoid": (torch.sigmoid, [(-110, 110)], 2, 2),
    "erf": (torch.erf, [(-6, 6), (-1e-3, 1e-3), (0.9, 1.1)], 2, None),
    "sin": (torch.sin, [(-10, 10), (-2e6, 2e6)], 1, 2),
    "cos": (torch.cos, [(-10, 10), (-2e6, 2e6)], 1, 2),
}
SPECIAL_EXPONENTS = [0.0, -0.0, 1.0, -1.0, 2.0, 3.0, -3.0, 0.5, -0.5, 2.5, 1e10, -1e10, math.inf, -math.inf,
                     math.nan, 127.0, -149.0]
# with FMA; without (the `a * b + c` path of kiln::fma); and, on an AVX-512 host, without
# AVX-512 (the portable paths that vscalefps/vgetexpps/vgetmantps replace there)
FMA = {"fma": (), "no-fma": ("-mno-fma",), "no-avx512": ("-mno-avx512f",)}
# Where the `a * b + c` path (no FMA) is looser. Measured since CppOptions.flags carry
# -ffp-contract=off: before, GCC fused `a * b + c` with AVX-512's FMA even under -mno-fma, so on
# an AVX-512 host this path was never compiled unfused (float64 sigmoid: 4 ulp at x = -36.8,
# the unfused exp(36.8) polynomial's error carried through 1 / (1 + e)).
NO_FMA_BOUNDS = {("sigmoid", torch.float64): 4}


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Float bits as integers that count ulps (adjacent floats differ by 1, -0 == +0)."""
    if t.dtype == torch.float32:
        bits, magnitude = t.view(torch.int32).long(), 0x7FFFFFFF
    else:
        bits, magnitude = t.view(torch.int64), 0x7FFFFFFFFFFFFFFF
    return torch.where(bits < 0, -(bits & magnitude), bits)


def _sweep(dtype: torch.dtype, ranges: list[tuple[float, float]], seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    parts = [torch.linspace(a, b, 200001, dtype=torch.float64).to(dtype) for a, b in ranges]
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    info = torch.iinfo(bits)
    parts.append(torch.randint(info.min, info.max, (200000,), dtype=bits, generator=generator).view(dtype))
    fi = torch.finfo(dtype)
    parts.append(torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, fi.tiny, -fi.tiny, fi.tiny / 8,
                               -fi.tiny / 1024, fi.smallest_normal * fi.eps, fi.max, -fi.max, 1.0, -1.0, 2.0, 0.5,
                               8.0, 1e-30, -1e-30, 1e30, -1e30, 88.7, 88.8, -87.3, -103.9, 127.9, 128.0, -149.5,
                               -150.0, 709.7, 709.8, -745.0, 1023.9, 1024.0, -1074.0, 3.92, 3.94, -3.93],
                              dtype=dtype))
    return torch.cat(parts)


def _max_ulp(got: torch.Tensor, ref: torch.Tensor, x: torch.Tensor) -> int | str:
    """The largest error in ulps, or what is wrong beyond ulps (with the first input)."""
    nan = got.isnan() != ref.isnan()
    if nan.any():
        return f"NaN where the reference has none, or the reverse, at {x[nan][:3].tolist()}"
    zero = ref == 0
    sign = got[zero].signbit() != ref[zero].signbit()
    if sign.any():
        return f"a zero of the wrong sign at {x[zero][sign][:3].tolist()}"
    finite = ~ref.isnan()
    return int((_ordered(got[finite]) - _ordered(ref[finite])).abs().max())


def _within(errors: dict[str, int | str], bounds: dict[str, int]) -> bool:
    return all(isinstance(errors[n], int) and errors[n] <= bounds[n] for n in bounds)


def _compile(fn, args, tmp_path, fma):
    flags = (*codegen_cpp.CppOptions().flags, *FMA[fma])
    options = codegen_cpp.CppOptions(cache_dir=tmp_path, vectorize=True, flags=flags)
    return codegen_cpp.compile(loopir.lower(make_fx(fn)(*args)), options)


def _reference(fn, dtype, *args):
    return fn(*(a.double() for a in args)).float() if dtype == torch.float32 else fn(*args)


@pytest.mark.parametrize("fma", list(FMA))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_vector_math_within_its_ulp_bound(tmp_path, dtype, fma):
    names = [n for n, (*_, b32, b64) in FUNCTIONS.items() if (b32 if dtype == torch.float32 else b64) is not None]
    inputs = [_sweep(dtype, FUNCTIONS[n][1]) for n in names]
    module = _compile(lambda *xs: tuple(FUNCTIONS[n][0](x) for n, x in zip(names, xs)), inputs, tmp_path, fma)
    source = module.meta["kiln_cpp"].source
    assert "// scalar loop" not in source and "// vector code" in source
    errors = {}
    for name, x, got in zip(names, inputs, module(*inputs)):
        assert f"kiln::{name}(tmp" in source
        errors[name] = _max_ulp(got, _reference(FUNCTIONS[name][0], dtype, x), x)
    bounds = {n: FUNCTIONS[n][2 if dtype == torch.float32 else 3] for n in names}
    if fma == "no-fma":
        bounds.update({n: b for (n, d), b in NO_FMA_BOUNDS.items() if d == dtype})
    print(f"ulp errors ({dtype}, {fma}): {errors}")
    assert _within(errors, bounds), (errors, bounds)


@pytest.mark.parametrize("fma", list(FMA))
def test_float32_pow_within_one_ulp(tmp_path, fma):
    x = _sweep(torch.float32, [(-4, 4), (0, 100)], seed=1)
    generator = torch.Generator().manual_seed(2)
    exponents = torch.tensor(SPECIAL_EXPONENTS)
    y = torch.where(torch.rand(x.shape, generator=generator) < 0.5, (torch.rand(x.shape, generator=generator) - 0.5) * 40,
                    exponents[torch.randint(len(exponents), x.shape, generator=generator)])
    module = _compile(torch.pow, (x, y), tmp_path, fma)
    assert "kiln::pow(tmp" in module.meta["kiln_cpp"].source
    error = _max_ulp(module(x, y), _reference(torch.pow, torch.float32, x, y), x)
    print(f"ulp error (pow, {fma}): {error}")
    assert _within({"pow": error}, {"pow": 1}), error


def test_float64_erf_stays_scalar_and_says_why(tmp_path):
    x = torch.linspace(-5, 5, 1001, dtype=torch.float64)
    module = _compile(torch.erf, (x,), tmp_path, "fma")
    assert "// scalar loop: not vectorized: erf of torch.float64" in module.meta["kiln_cpp"].source
    torch.testing.assert_close(module(x), torch.erf(x))


def _avx512_host() -> bool:
    try:
        return "avx512f" in open("/proc/cpuinfo").read().split()
    except OSError:
        return False


@pytest.mark.skipif(not _avx512_host(), reason="reads x86 AVX-512 assembly")
def test_float32_log1p_divides_without_a_division_instruction_on_avx512():
    """log1p's c / u term is vrcp14ps and a corrected quotient (its bound: the sweep above), not a
    vdivps (5-16 cycles of throughput per vector, unpipelined): read in the kernel's assembly."""
    options = codegen_cpp.CppOptions(vectorize=True, openmp=False)
    source = codegen_cpp.generate(loopir.lower(make_fx(torch.log1p)(torch.randn(64, 1024))), options)
    assembly = subprocess.run([options.compiler, *options.flags, "-fopenmp-simd", "-S", "-o", "-", "-x", "c++", "-"],
                              input=source, capture_output=True, text=True, check=True).stdout
    kernel = assembly[assembly.index("kernel0:"):]
    kernel = kernel[:kernel.index(".cfi_endproc")]
    assert "vrcp14ps" in kernel and "vdivps" not in kernel


@pytest.mark.parametrize("width", [32, 16, 4])
def test_float32_log1p_within_its_bound_at_narrower_widths(tmp_path, width):
    """The ulp test above runs the host's widest vectors; AVX-512VL's 32- and 16-byte
    reciprocals (and a single lane's division) go through `quotient` too."""
    x = _sweep(torch.float32, FUNCTIONS["log1p"][1])
    flags = (*codegen_cpp.CppOptions().flags, f"-DKILN_VECTOR_BYTES={width}")
    module = codegen_cpp.compile(loopir.lower(make_fx(torch.log1p)(x)),
                                 codegen_cpp.CppOptions(cache_dir=tmp_path, vectorize=True, flags=flags))
    assert _within({"log1p": _max_ulp(module(x), _reference(torch.log1p, torch.float32, x), x)},
                   {"log1p": FUNCTIONS["log1p"][2]})
