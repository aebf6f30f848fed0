"""bfloat16 and float16 in loopir: loads upcast to float32, math in float32, one rounding to the
storage dtype on store; reductions accumulate in float32 (Inductor's semantics)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, verify
from kiln.loopir._internal.ops import Printer

LOW = [torch.bfloat16, torch.float16]


def softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def layer_norm(x, w, b):
    centered = x - x.mean(-1, keepdim=True)
    return centered * torch.rsqrt((centered * centered).mean(-1, keepdim=True) + 1e-5) * w + b


def rms_norm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def gelu(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def mlp(x, w1, w2):
    h = x @ w1
    return (h * torch.sigmoid(h)) @ w2


def _lowered(fn, *args):
    kg = lower(make_fx(fn)(*args))
    verify(kg)
    return kg


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("fn", [softmax, layer_norm, rms_norm, gelu, mlp])
def test_low_precision_blocks_match_a_float64_reference_as_well_as_eager(fn, dtype):
    torch.manual_seed(0)
    shapes = {softmax: [(32, 256)], layer_norm: [(32, 256), (256,), (256,)], rms_norm: [(32, 256), (256,)],
              gelu: [(32, 256)], mlp: [(16, 64), (64, 128), (128, 32)]}[fn]
    args = [torch.randn(s).to(dtype) for s in shapes]
    kg = _lowered(fn, *args)
    assert kg.kernels
    got = kg(*args)
    reference = fn(*(a.double() for a in args))
    eager = fn(*args)
    assert got.dtype == eager.dtype == dtype
    kiln_error = (got.double() - reference).abs().max()
    eager_error = (eager.double() - reference).abs().max()
    # one rounding on store, no intermediate ones: never much worse than eager's per-op rounding
    assert kiln_error <= eager_error * 1.5 + 1e-6, (float(kiln_error), float(eager_error))


@pytest.mark.parametrize("dtype", LOW)
def test_math_runs_in_float32_and_rounds_once_on_store(dtype):
    x = torch.randn(4, 8).to(dtype)
    (kernel,) = _lowered(lambda x: (x * 3 + 1).exp(), x).kernels
    (node,) = kernel.nodes
    printer = Printer()
    node.run(printer, *kernel.placement(node))
    lines = printer.lines
    name = str(dtype).removeprefix("torch.")
    assert lines[1] == "t1 = to_dtype(t0, float32)"  # the load, upcast
    assert [line for line in lines if "to_dtype" in line] == [lines[1], f"t{len(lines) - 2} = to_dtype(t{len(lines) - 3}, {name})"]
    assert lines[-1].startswith("t") and "store(" in lines[-1]


def test_reductions_accumulate_in_float32():
    x = torch.ones(8192, dtype=torch.bfloat16)  # a bfloat16 accumulator stops at 256
    kg = _lowered(lambda x: (x.sum(), x.mean(), (x * 0.001).sum()), x)
    total, mean, small = kg(x)
    assert total.dtype == torch.bfloat16 and float(total) == 8192.0 and float(mean) == 1.0
    torch.testing.assert_close(small, (x.float() * 0.001).sum().to(torch.bfloat16))
    reduction = next(n for k in kg.kernels for n in k.nodes if n.reduction_ranges)
    assert reduction.body.dtype == torch.float32


@pytest.mark.parametrize("dtype", LOW)
def test_arg_reductions_and_comparisons_in_low_precision(dtype):
    x = torch.randn(6, 33).to(dtype)
    x[2, 7] = float("nan")
    kg = _lowered(lambda x: (x.argmax(-1), x.amin(0), x > 0.5, torch.where(x > 0, x, 0.25 * x)), x)
    for got, expected in zip(kg(x), (x.argmax(-1), x.amin(0), x > 0.5, torch.where(x > 0, x, 0.25 * x))):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, equal_nan=True)


def test_explicit_casts_round_as_eager():
    x = torch.randn(64) * 3
    # an explicit round trip through bfloat16 is a real rounding, kept (autocast's casts)
    kg = _lowered(lambda x: x.to(torch.bfloat16).to(torch.float32) * 2, x)
    torch.testing.assert_close(kg(x), x.to(torch.bfloat16).float() * 2, rtol=0, atol=0)


def test_mixed_float32_and_bfloat16_promote_as_eager():
    x, w = torch.randn(8, 16), torch.randn(16).to(torch.bfloat16)
    kg = _lowered(lambda x, w: (x * w, w * 2.5, (w + w).float()), x, w)
    for got, expected in zip(kg(x, w), (x * w, w * 2.5, (w + w).float())):
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("dtype", LOW)
def test_round_low_precision_rounds_each_op_as_eager(dtype):
    torch.manual_seed(0)
    x = torch.randn(64, 96).to(dtype)
    chain = lambda x: ((x * 1.1 + 0.3).exp() * 0.7 - x).sigmoid()  # noqa: E731
    gm = make_fx(chain)(x)
    once, each = lower(gm), lower(gm, round_low_precision=True)
    eager = chain(x)
    # rounding after every op gives eager's results but where eager's own math (vectorized exp,
    # sigmoid) differs in float32's last bits across a rounding boundary; once on store is
    # farther from eager, and closer to float64
    each_mismatch = (each(x) != eager).float().mean()
    once_mismatch = (once(x) != eager).float().mean()
    assert each_mismatch < 0.1 and each_mismatch < once_mismatch / 2, (float(each_mismatch), float(once_mismatch))
    torch.testing.assert_close(each(x), eager, rtol=2 ** -6, atol=0)  # at most two ulps apart
    reference = chain(x.double())
    assert (once(x).double() - reference).abs().max() <= (eager.double() - reference).abs().max()
    assert str(each.kernels[0]).count("to_dtype") > str(once.kernels[0]).count("to_dtype")
