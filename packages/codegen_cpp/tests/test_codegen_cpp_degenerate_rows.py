"""Rows of one element (layer norm, rmsnorm, softmax, var): eager's exact results, on the scalar
path and on vector code.

The fuzzer found `layer_norm(rms_norm(x, (1,)), (1,))` on 8x1 giving ~1e-5 where eager gives 0:
GCC's default `-ffp-contract=fast` fused `x * rsqrt(...) - mean` into one fma, so the product
was not rounded before the subtraction and `x - mean(x)` over one element was its rounding
error, scaled by rsqrt(eps). CppOptions.flags now carry `-ffp-contract=off`.
"""

from __future__ import annotations

import pytest
import torch


# The decomposed forms, as decomp.loop_level() writes them (codegen_cpp's tests trace ATen).
def _rms_norm(x, eps=1.1920928955078125e-07):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _layer_norm(x):
    centered = x - x.mean(-1, keepdim=True)
    return centered * torch.rsqrt((centered * centered).mean(-1, keepdim=True) + 1e-5)


def _softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def _log_softmax(x):
    shifted = x - x.amax(-1, keepdim=True)
    return shifted - shifted.exp().sum(-1, keepdim=True).log()


def _var(x):  # unbiased: over one element 0 / 0, NaN as eager
    centered = x - x.mean(-1, keepdim=True)
    return (centered * centered).sum(-1) / (x.shape[-1] - 1)


def _eager_var(x):
    with pytest.warns(UserWarning, match="degrees of freedom"):
        return torch.var(x, -1, unbiased=True)


# name: (kiln's function, eager's function, exact); exact cases compare bit for bit (eager's
# result there is exactly 0, 1 or NaN whatever rounding the row's own values had).
CASES = {
    "layer_norm(rms_norm(x)) (the fuzzer's case)": (
        lambda x, y: _layer_norm(_rms_norm(x)),
        lambda x, y: torch.nn.functional.layer_norm(torch.rms_norm(x, (1,)), (1,)), True),
    "layer_norm(x * y) (a product fused into the centering)": (
        lambda x, y: _layer_norm(x * y), lambda x, y: torch.nn.functional.layer_norm(x * y, (1,)), True),
    "layer_norm(x)": (lambda x, y: _layer_norm(x), lambda x, y: torch.nn.functional.layer_norm(x, (1,)), True),
    "softmax": (lambda x, y: _softmax(x * y), lambda x, y: torch.softmax(x * y, -1), True),
    "log_softmax": (lambda x, y: _log_softmax(x * y), lambda x, y: torch.log_softmax(x * y, -1), True),
    "var, unbiased": (lambda x, y: _var(x * y), lambda x, y: _eager_var(x * y), True),
    "rms_norm": (lambda x, y: _rms_norm(x * y), lambda x, y: torch.rms_norm(x * y, (1,)), False),
}


@pytest.mark.parametrize("vectorize", [True, False], ids=["vector", "scalar"])
@pytest.mark.parametrize("shape", [(8, 1), (1, 1), (3, 5, 1), (37, 1)])
@pytest.mark.parametrize("name", list(CASES))
def test_rows_of_one_element_match_eager(cpp, name, shape, vectorize):
    kiln_fn, eager_fn, exact = CASES[name]
    torch.manual_seed(0)
    x, y = torch.randn(shape), torch.randn(shape) * 3
    compiled = cpp.with_options(vectorize=vectorize).build(kiln_fn, x, y)
    assert compiled.kernel_graph.kernels and "extern \"C\" void kernel0(" in compiled.source
    tolerances = {"rtol": 0, "atol": 0} if exact else {}
    cpp.assert_same(compiled.module(x, y), eager_fn(x, y), **tolerances)


def test_products_are_rounded_before_they_are_added(cpp):
    """`a * b - c` with c == a * b is exactly 0 (no fma contraction), for every x."""
    x = torch.linspace(-3, 3, 4099)
    y = torch.full_like(x, 1.0 / 3.0)

    def centered_product(x, y):
        product = x * y
        return product - product.mean(-1, keepdim=True)

    assert "-ffp-contract=off" in cpp.options.flags
    for vectorize in (True, False):
        compiled = cpp.with_options(vectorize=vectorize).build(centered_product, x[:, None], y[:, None])
        assert torch.equal(compiled.module(x[:, None], y[:, None]), torch.zeros(4099, 1))
