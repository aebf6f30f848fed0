"""int8, uint8 and int16 compile to kiln kernels on every codegen (issue 20): arithmetic wraps
where each op makes its result (uint8 modulo 256), as eager; division, remainder, shifts and
bitwise ops with eager's rules for unsigned and signed types; type promotion as eager;
reductions, scans and accumulating scatters (Triton: serial, no 8/16-bit atomics)."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend, explain

CODEGENS = ("reference", "cpu", "cuda")  # "cuda" is the Triton codegen; under TRITON_INTERPRET=1 on the CPU
DTYPES = (torch.uint8, torch.int8, torch.int16)


def _compiled(fn, codegen):
    return torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options={"fallback": False, "codegen": codegen}))


def _operands(dtype):
    info = torch.iinfo(dtype)
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(info.min, info.max + 1, (5, 7), generator=gen).to(dtype) for _ in range(2))
    return a, torch.where(b == 0, torch.ones_like(b), b)


def _three(dtype):
    return torch.tensor(3, dtype=dtype)


def everything(a, b):
    three, one = _three(a.dtype), torch.tensor(1, dtype=a.dtype)
    wider = torch.int32 if a.dtype == torch.int16 else torch.int16
    return (
        torch.div(a + b, 3, rounding_mode="floor"),  # the sum wraps before the division
        a * b - a, (-a).abs() + 1, (~a & b) | (a ^ 5),
        torch.bitwise_right_shift(torch.bitwise_left_shift(a, three), one),
        torch.div(a, b, rounding_mode="floor"), torch.div(a, b, rounding_mode="trunc"), a % b,
        torch.where(a > b, a, b * 2), torch.maximum(a, b) - torch.minimum(a, b),
        a.sum(1), a.amax(0), (a * 2).amin(), a.cumsum(1),
        a + b.to(wider), a * 3 + 250,  # 250 wraps into an int8 operand, as eager converts it
        a.float() / 7 + b,
        a.scatter_add(0, torch.tensor([[0, 1, 1, 4, 0, 2, 2]]), b[:1]),
        a.scatter_reduce(0, torch.tensor([[0, 1, 1, 4, 0, 2, 2]]), b[:1], "amax", include_self=False),
    )


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_small_integer_ops_match_eager(dtype, codegen):
    a, b = _operands(dtype)
    report = explain(everything, a, b, options={"fallback": False, "codegen": codegen})
    assert report.kernel_count >= 3 and not report.fallback_nodes, str(report)
    torch._dynamo.reset()
    for got, expected in zip(_compiled(everything, codegen)(a, b), everything(a, b)):
        torch.testing.assert_close(got, expected)
