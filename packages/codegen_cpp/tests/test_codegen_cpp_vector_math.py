"""kiln's vector math meets its stated ulp bounds (the table in `_internal/vector_math.py`).

Each function is compiled as a one-op pointwise kernel, so every element goes through the
vector code (the tail as a partial vector), and swept over dense ranges, 300k random bit
patterns (every magnitude, denormals, NaNs) and the special values. float32 results are
compared with the float64 result rounded to float32; float64 results with torch's float64.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, loopir

# function -> (torch function, dense ranges swept, float32 bound, float64 bound or None: scalar)
FUNCTIONS = {
    "exp": (torch.exp, [(-110, 90)], 1, 1),
    "expm1": (torch.expm1, [(-20, 90), (-1e-3, 1e-3)], 1, 3),
    "log": (torch.log, [(0, 1e6), (0, 2)], 1, 3),
    "log1p": (torch.log1p, [(-1, 100), (-1e-3, 1e-3)], 1, 4),
    "tanh": (torch.tanh, [(-12, 12), (-1e-3, 1e-3)], 1, 3),
    "sigmoid": (torch.sigmoid, [(-110, 110)], 2, 2),
    "erf": (torch.erf, [(-6, 6), (-1e-3, 1e-3)], 1, None),
}


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Float bits as integers that count ulps (adjacent floats differ by 1, -0 == +0)."""
    if t.dtype == torch.float32:
        bits, magnitude = t.view(torch.int32).long(), 0x7FFFFFFF
    else:
        bits, magnitude = t.view(torch.int64), 0x7FFFFFFFFFFFFFFF
    return torch.where(bits < 0, -(bits & magnitude), bits)


def _sweep(dtype: torch.dtype, ranges: list[tuple[float, float]]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    parts = [torch.linspace(a, b, 300001, dtype=torch.float64).to(dtype) for a, b in ranges]
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    info = torch.iinfo(bits)
    parts.append(torch.randint(info.min, info.max, (300000,), dtype=bits, generator=generator).view(dtype))
    fi = torch.finfo(dtype)
    parts.append(torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0, fi.tiny, -fi.tiny, fi.tiny / 8,
                               -fi.tiny / 1024, fi.smallest_normal * fi.eps, fi.max, -fi.max, 1.0, -1.0,
                               1e-30, -1e-30, 1e30, -1e30, 88.7, 88.8, -87.3, -103.9, 709.7, 709.8, -745.0],
                              dtype=dtype))
    return torch.cat(parts)


def _max_ulp(got: torch.Tensor, ref: torch.Tensor) -> int:
    assert torch.equal(got.isnan(), ref.isnan()), "NaN where the reference has none, or the reverse"
    zero = ref == 0
    assert torch.equal(got[zero].signbit(), ref[zero].signbit()), "a zero of the wrong sign"
    finite = ~ref.isnan()
    return int((_ordered(got[finite]) - _ordered(ref[finite])).abs().max())


CASES = [(name, dtype) for name, (*_, b32, b64) in FUNCTIONS.items()
         for dtype, bound in ((torch.float32, b32), (torch.float64, b64)) if bound is not None]


@pytest.mark.parametrize(("name", "dtype"), CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_vector_math_within_its_ulp_bound(tmp_path, name, dtype):
    fn, ranges, bound32, bound64 = FUNCTIONS[name]
    x = _sweep(dtype, ranges)
    module = codegen_cpp.compile(loopir.lower(make_fx(fn)(x)), codegen_cpp.CppOptions(cache_dir=tmp_path, vectorize=True))
    source = module.meta["kiln_cpp"].source
    assert f"kiln::{name}(tmp" in source and "// vector code" in source
    got = module(x)
    ref = fn(x.double()).float() if dtype == torch.float32 else fn(x)
    assert _max_ulp(got, ref) <= (bound32 if dtype == torch.float32 else bound64)


def test_float64_erf_stays_scalar_and_says_why(tmp_path):
    x = torch.linspace(-5, 5, 1001, dtype=torch.float64)
    module = codegen_cpp.compile(loopir.lower(make_fx(torch.erf)(x)), codegen_cpp.CppOptions(cache_dir=tmp_path, vectorize=True))
    assert "// scalar loop: not vectorized: erf of torch.float64" in module.meta["kiln_cpp"].source
    torch.testing.assert_close(module(x), torch.erf(x))
