"""Cumulative ops compile to kiln `Scan` kernels on every codegen (issue 20): cumsum, cumprod,
logcumsumexp, cummax/cummin with eager's tie and NaN rules, over every dim, long rows (several
Triton chunks), transposed inputs, low precision, and their backward."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend, explain

CODEGENS = ("reference", "cpu", "cuda")  # "cuda" is the Triton codegen; under TRITON_INTERPRET=1 on the CPU


def _compiled(fn, codegen):
    return torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options={"fallback": False, "codegen": codegen}))


def _x(shape, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)  # drawn on the CPU, then to the default device (conftest.py)
    return torch.randn(shape, generator=gen, device="cpu").to(torch.get_default_device(), dtype)


CASES = {
    # name: (fn, input)
    "cumsum_last": (lambda x: x.cumsum(-1), _x((6, 37))),
    "cumsum_first_3d": (lambda x: (x * 2).cumsum(0) + 1, _x((5, 4, 9))),
    "cumsum_middle_transposed": (lambda x: x.transpose(1, 2).cumsum(1), _x((3, 7, 11))),
    "cumsum_long_row": (lambda x: x.cumsum(1), _x((3, 4500))),
    "cumsum_int32_to_int64": (lambda x: (x * 10).to(torch.int32).cumsum(1), _x((4, 50))),
    "cumsum_bool": (lambda x: (x > 0).cumsum(0), _x((40, 3))),
    "cumsum_dtype_float64": (lambda x: x.cumsum(1, dtype=torch.float64), _x((4, 33))),
    "cumsum_bfloat16": (lambda x: x.bfloat16().cumsum(1), _x((4, 64))),
    "cumsum_0d": (lambda x: x.sum().cumsum(0), _x((4, 3))),
    "cumprod": (lambda x: (x * 0.05 + 1).cumprod(1), _x((5, 300))),
    "cumprod_int64": (lambda x: (x.abs() * 2).long().clamp(1, 3).cumprod(1), _x((3, 20))),
    "logcumsumexp": (lambda x: (x * 30).logcumsumexp(1), _x((4, 2100))),
    "logcumsumexp_infinities": (lambda x: torch.where(x > 1, float("inf"), torch.where(x < -1, -float("inf"), x))
                                .logcumsumexp(0), _x((60, 5))),
    "cummax_nan_and_ties": (lambda x: torch.where(x.abs() > 2, float("nan"), x.round()).cummax(1), _x((6, 1500))),
    "cummin_nan_and_ties": (lambda x: torch.where(x.abs() > 2, float("nan"), x.round()).cummin(0), _x((200, 3))),
    "cummax_int": (lambda x: (x * 3).long().cummax(1), _x((5, 70))),
}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_scan_matches_eager(name, codegen):
    fn, x = CASES[name]
    report = explain(fn, x, options={"fallback": False, "codegen": codegen})
    assert report.kernel_count >= 1 and not report.fallback_nodes, str(report)
    torch._dynamo.reset()
    got, expected = _compiled(fn, codegen)(x), fn(x)
    low = expected[0].dtype if isinstance(expected, tuple) else expected.dtype
    tol = {"rtol": 2e-2, "atol": 5e-2} if low == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(got, expected, equal_nan=True, **tol)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_scan_gradients_match_eager(codegen):
    def fn(x, w):
        return ((x.cumsum(1) * w).logcumsumexp(0) + (x * 0.1 + 1).cumprod(1)).sum()

    x, w = _x((5, 40)).requires_grad_(), _x((5, 40), seed=1)
    got = torch.autograd.grad(_compiled(fn, codegen)(x, w), x)[0]
    expected = torch.autograd.grad(fn(x, w), x)[0]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_scan_has_a_kernel_of_its_own_with_its_producers_inlined():
    report = explain(lambda x: (x.sin() * 2).cumsum(1) + 1, _x((3, 50)), options={"fallback": False,
                                                                                   "codegen": "reference"})
    assert report.kernel_count == 2, str(report)
    assert any(d.kind == "scan" and not d.fused for d in report.fusions), str(report)
