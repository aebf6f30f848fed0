"""bfloat16/float16 conversions in generated C++, bit for bit against torch: every 16-bit
pattern widened to float32, a dense sample of float32 (every rounding boundary, ties,
subnormals, overflow, NaN, +-inf, +-0) narrowed, float64 and integers through float32 as torch
does; on the scalar path (GCC's auto-vectorizer, checked on its report) and on the vector layer
at every SIMD width."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, loopir

LOW = [torch.bfloat16, torch.float16]
# The scalar path, and the vector layer at the widths of test_codegen_cpp_vector.py (one lane,
# SSE/NEON, AVX2, AVX-512).
PATHS = {"scalar": None, "vector-4": 4, "vector-16": 16, "vector-32": 32, "vector-64": 64}


@pytest.fixture(params=list(PATHS))
def path(request, cpp):
    width = PATHS[request.param]
    if width is None:
        return cpp
    return cpp.with_options(vectorize=True, flags=(*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}"))


def _is_vector(builder) -> bool:
    return builder.options.vectorize


def _every_bit_pattern(dtype):
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype)


def _bits(t):
    """The raw bits of a 16- or 32-bit float tensor as int64 (unsigned)."""
    ints = t.view(torch.int16 if t.element_size() == 2 else torch.int32).to(torch.int64)
    return ints & (0xFFFF if t.element_size() == 2 else 0xFFFFFFFF)


def _from_bits(values):
    values = torch.as_tensor(values, dtype=torch.int64)
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32).view(torch.float32)


def dense_float32_sample() -> torch.Tensor:
    """float32 values where rounding to 16 bits can go wrong: around every bfloat16 value (the
    ties 0x8000 and the patterns beside them in the low 16 bits), the float16 rounding points
    (low 13 bits) over its whole range and subnormals, overflow to inf, a random 2^20 bit
    patterns of every magnitude, and the special values."""
    high = torch.arange(65536, dtype=torch.int64) << 16
    around_bf16 = torch.cat([high | low for low in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF)])
    # float16's range in float32: exponents 2^-25 .. 2^16, every 13-bit tie and its neighbours
    fp16_span = torch.arange(0x32800000 >> 13, (0x47800000 >> 13) + 1, dtype=torch.int64) << 13
    around_fp16 = torch.cat([fp16_span | low for low in (0x0000, 0x0FFF, 0x1000, 0x1001)])
    around_fp16 = torch.cat([around_fp16, around_fp16 | 0x80000000])
    random = torch.randint(0, 2**32, (1 << 20,), generator=torch.Generator().manual_seed(0), dtype=torch.int64)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -float("nan"), 65504.0, 65519.996,
                            65520.0, -65520.0, 65536.0, 3.3961e38, 3.4028235e38, 2.0**-14, 2.0**-24, 2.0**-25,
                            3 * 2.0**-26, 1e-45, -1e-45, 1.1754942e-38, 2.0**-133])
    return torch.cat([_from_bits(around_bf16), _from_bits(around_fp16), _from_bits(random), special])


@pytest.mark.parametrize("dtype", LOW)
def test_every_bit_pattern_widens_exactly(path, dtype):
    x = _every_bit_pattern(dtype)
    compiled = path.build(lambda x: x.float(), x)
    got = compiled.module(x)
    expected = x.float()
    numbers = ~expected.isnan()
    assert torch.equal(_bits(got)[numbers], _bits(expected)[numbers])
    # A NaN keeps its sign and payload (torch's own float16 widening drops the sign of some).
    bits = _bits(x)[~numbers]
    if dtype == torch.bfloat16:
        want = bits << 16
    else:
        want = ((bits & 0x8000) << 16) | 0x7F800000 | ((bits & 0x3FF) << 13)
    assert torch.equal(_bits(got)[~numbers], want)
    assert ("// vector code" in compiled.source) == _is_vector(path)


@pytest.mark.parametrize("dtype", LOW)
def test_float32_rounds_to_nearest_even_as_torch(path, dtype):
    x = dense_float32_sample()
    compiled = path.build(lambda x: x.to(dtype), x)
    got = compiled.module(x)
    expected = x.to(dtype)
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan)
    mismatch = (_bits(got) != _bits(expected)) & ~nan
    assert not mismatch.any(), (x[mismatch][:8], got[mismatch][:8], expected[mismatch][:8])
    # NaN: quiet, with the input's sign (torch's CPU kernels make every bfloat16 NaN 0xffff)
    quiet = 0x0040 if dtype == torch.bfloat16 else 0x0200
    nan_bits, sign = _bits(got)[nan], _bits(x)[nan] >> 31
    assert torch.equal(nan_bits >> 15, sign) and bool(((nan_bits & quiet) != 0).all())
    assert ("// vector code" in compiled.source) == _is_vector(path)


@pytest.mark.parametrize("dtype", LOW)
def test_float64_and_integers_round_through_float32_as_torch(path, dtype):
    """torch converts float64 and integers to bfloat16/float16 through float32 (a double
    rounding): 1 + 2^-8 + 2^-30 is 1 in bfloat16, not 1 + 2^-7."""
    doubles = torch.tensor([1 + 2**-8 + 2**-30, 1 + 2**-11 + 2**-40, -(1 + 2**-8 + 2**-30), 65519.99999999,
                            1e300, -1e-300, 2.0**-1074, 0.1, float("inf"), float("nan")], dtype=torch.float64)
    doubles = torch.cat([doubles, torch.randn(997, dtype=torch.float64) * 1000])
    ints = torch.tensor([2**32 + 2**24 + 1, 2**11 + 1, -(2**53 + 1), 2**62, 65519, 65520, -7], dtype=torch.int64)
    ints = torch.cat([ints, torch.randint(-2**40, 2**40, (997,))])
    small = torch.randint(-70000, 70000, (1000,), dtype=torch.int32)
    flags = torch.rand(1000) > 0.5

    def f(d, i, s, b):
        return d.to(dtype), i.to(dtype), s.to(dtype), b.to(dtype)

    compiled = path.build(f, doubles, ints, small, flags)
    for got, expected in zip(compiled.module(doubles, ints, small, flags), f(doubles, ints, small, flags)):
        assert got.dtype == dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_converts_to_every_other_dtype_as_torch(path, dtype):
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    x = _every_bit_pattern(dtype)
    finite = x[x.isfinite() & (x.float().abs() < 2**31)]

    def f(x, finite):
        return x.double(), x.to(other), x != 0, finite.to(torch.int64), finite.to(torch.int32)

    compiled = path.build(f, x, finite)
    for got, expected in zip(compiled.module(x, finite), f(x, finite)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


# -- GCC auto-vectorizes the scalar path's conversions ------------------------------------------


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (-fopt-info-vec)")
@pytest.mark.parametrize("dtype", LOW)
def test_scalar_conversion_loops_are_auto_vectorized(cpp, tmp_path, dtype):
    """The scalar path relies on GCC's vectorizer: the 16-bit conversions are
    branch-free integer code, so each conversion loop is reported vectorized."""
    def f(x, y):
        return x.float() * 2, (y * 3).to(dtype)

    kernel_graph = loopir.lower(make_fx(f)(torch.ones(4096).to(dtype), torch.ones(4096)))
    source = codegen_cpp.generate(kernel_graph, dataclasses.replace(cpp.options, vectorize=False))
    assert "kiln_float_to_" in source and "_to_float(" in source
    path = tmp_path / "kernels.cpp"
    path.write_text(source)
    report = subprocess.run(["g++", *cpp.options.flags, "-fopenmp", "-fopt-info-vec-optimized", "-c", str(path),
                             "-o", str(tmp_path / "kernels.o")], capture_output=True, text=True, check=True).stderr
    vectorized = {int(n) for n in re.findall(r"kernels\.cpp:(\d+):\d+: optimized: loop vectorized", report)}
    lines = source.splitlines()
    loops = [n for n, line in enumerate(lines, 1) if re.search(r"for \(int64_t i0 = 0; i0 < 4096", line)]
    assert loops
    for start in loops:  # GCC reports a loop at a line of its body
        indent = len(lines[start - 1]) - len(lines[start - 1].lstrip())
        end = next(n for n in range(start + 1, len(lines) + 1) if lines[n - 1] == " " * indent + "}")
        assert vectorized & set(range(start, end)), (lines[start - 1:end], report)
