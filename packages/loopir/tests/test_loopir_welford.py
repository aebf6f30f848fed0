"""`LowerOptions.welford`: a variance's second pass (the sum of squared deviations from the mean
of values a sum in the same kernel reduces) becomes a `Welford` node reducing those values to
their m2, so both reduce the same values at the same place (one pass in codegens that share the
loop); the `Welford` node kind on the reference evaluator and the other handlers."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import (
    REFERENCE_CODEGEN,
    BufferSpec,
    Capabilities,
    ComputedBuffer,
    Kernel,
    Reduction,
    lower,
    verify,
)
from kiln.loopir._internal.ir import Welford
from kiln.loopir._internal.ops import WELFORD_STATISTICS, Printer
from kiln.loopir._internal.welford import welford_kernel

pytestmark = pytest.mark.filterwarnings("ignore:var_mean.*degrees of freedom:UserWarning")  # eager, correction >= n


def shifted_var_mean(x, dim=-1, correction=1, keepdim=False):
    """var_mean as kiln's decomposition writes it (decomp's `_var_and_mean`): two passes over
    `x` upcast and shifted by its first element along `dim`."""
    n = x.shape[dim]
    values = x.float()
    shift = values.narrow(dim, 0, 1) if n else None
    if shift is not None:
        values = values - shift
    mean = values.mean(dim, keepdim=True)
    deviation = values - mean
    var = (deviation * deviation).sum(dim, keepdim=True) / max(n - correction, 0)
    if shift is not None:
        mean = mean + shift
    if not keepdim:
        var, mean = var.squeeze(dim), mean.squeeze(dim)
    return var.to(x.dtype), mean.to(x.dtype)


def normalized(x, dims):
    """The statistics of decomp's layer/group/batch norms: mean, then the mean of squared deviations."""
    mean = x.mean(dims, keepdim=True)
    deviation = x - mean
    var = (deviation * deviation).mean(dims, keepdim=True)
    return deviation * torch.rsqrt(var + 1e-5), mean, var


def _lowered(fn, *args, welford=True, **options):
    kg = lower(make_fx(fn)(*args), welford=welford, row_temporaries=True, recompute_cheap=True, **options)
    verify(kg)
    for kernel in kg.kernels:  # rows and placements the rewrite kept are what the ranges give
        worked_out = dataclasses.replace(kernel, rows=None, placements=None)
        assert all(kernel.placement(n) == worked_out.placement(n) for n in kernel.nodes)
        assert all(kernel.is_row(n) == worked_out.is_row(n) for n in kernel.nodes)
    return kg


def _welford_nodes(kg):
    return [(kernel, node) for kernel in kg.kernels for node in kernel.nodes if isinstance(node.body, Welford)]


def _assert_one_pass(kg, count=1):
    """`count` Welford m2 nodes, each beside a plain sum of the same values at the same place (or
    alone, when nothing else reads that sum)."""
    found = _welford_nodes(kg)
    assert len(found) == count, kg
    for kernel, node in found:
        assert node.body.statistic == "m2" and node.body.reduction_type == "welford"
        sums = [n for n in kernel.nodes if type(n.body) is Reduction]
        for other in sums:
            assert other.body.loop_body == node.body.loop_body and kernel.placement(other) == kernel.placement(node)


@pytest.mark.parametrize("correction", [0, 1, 37])
@pytest.mark.parametrize("keepdim", [False, True])
def test_var_mean_second_pass_becomes_welford(correction, keepdim):
    x = torch.randn(6, 37) * 1e-2 + 1e4

    def fn(x):
        return shifted_var_mean(x, -1, correction, keepdim)

    kg = _lowered(fn, x)
    _assert_one_pass(kg)
    assert len([n for k in kg.kernels for n in k.nodes if isinstance(n.body, Reduction)]) == 2
    var, mean = torch.var_mean(x, -1, correction=correction, keepdim=keepdim)
    got_var, got_mean = kg(x)
    torch.testing.assert_close(got_var, var, rtol=1e-5, atol=0, equal_nan=True)
    torch.testing.assert_close(got_mean, mean, rtol=1e-7, atol=0)
    assert not _welford_nodes(_lowered(fn, x, welford=False)), "without the option the two passes stay"


def test_var_alone_keeps_no_sum():
    x = torch.randn(5, 33)
    kg = _lowered(lambda x: shifted_var_mean(x)[0], x)
    _assert_one_pass(kg)
    (kernel,) = kg.kernels
    assert not [n for n in kernel.nodes if type(n.body) is Reduction], "the sum only the second pass read is dropped"
    torch.testing.assert_close(kg(x), x.var(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_statistics_become_welford(dtype):
    x = torch.randn(4, 8, 6, 5).to(dtype)
    layer = _lowered(lambda x: normalized(x.float(), [-1])[0].to(dtype), x)
    _assert_one_pass(layer)
    torch.testing.assert_close(layer(x), torch.nn.functional.layer_norm(x.float(), [5]).to(dtype))
    group = _lowered(lambda x: normalized(x.float().reshape(4, 2, -1), [2])[1:], x)
    _assert_one_pass(group)
    torch.testing.assert_close(group(x), normalized(x.float().reshape(4, 2, -1), [2])[1:])


def test_batch_norm_statistics_over_strided_rows():
    x = torch.randn(3, 4, 5, 7)
    kg = _lowered(lambda x: normalized(x, [0, 2, 3])[1:], x)
    _assert_one_pass(kg)
    torch.testing.assert_close(kg(x), normalized(x, [0, 2, 3])[1:])


def test_empty_rows_and_dynamic_sizes():
    empty = torch.randn(4, 0)
    kg = _lowered(lambda x: shifted_var_mean(x), empty)
    _assert_one_pass(kg)
    torch.testing.assert_close(kg(empty), torch.var_mean(empty, -1), equal_nan=True)
    x = torch.randn(3, 21)
    dynamic = lower(make_fx(lambda x: shifted_var_mean(x), tracing_mode="symbolic")(x), welford=True,
                    recompute_cheap=True)
    verify(dynamic)
    _assert_one_pass(dynamic)
    for shape in [(3, 21), (2, 1000)]:
        y = torch.randn(shape)
        torch.testing.assert_close(dynamic(y), torch.var_mean(y, -1))


NOT_A_VARIANCE = {
    "deviations of other values": (
        lambda x, y: ((x - y.mean(-1, keepdim=True)) ** 2).sum(-1) + y.mean(-1)),
    "divided by another count": (
        lambda x, y: ((x - x.sum(-1, keepdim=True) / 36) ** 2).sum(-1)),
    "cubed deviations": (
        lambda x, y: ((x - x.mean(-1, keepdim=True)) ** 3).sum(-1)),
    "the mean over other dims": (
        lambda x, y: ((x - x.mean(0, keepdim=True)) ** 2).sum(-1)),
    "the two passes in different kernels (an extern reads the deviations)": (
        lambda x, y: (((x - x.mean(-1, keepdim=True)) @ y.t()), ((x - x.mean(-1, keepdim=True)) ** 2).sum(-1))),
}


@pytest.mark.parametrize("name", sorted(NOT_A_VARIANCE))
def test_pattern_not_found(name):
    fn = NOT_A_VARIANCE[name]
    x, y = torch.randn(6, 37), torch.randn(6, 37)
    kg = _lowered(fn, x, y)
    assert not _welford_nodes(kg)
    torch.testing.assert_close(kg(x, y), fn(x, y), rtol=1e-4, atol=1e-4)


def test_rewrite_is_idempotent_and_a_value():
    x = torch.randn(4, 16)
    once = _lowered(lambda x: shifted_var_mean(x), x)
    (kernel,) = once.kernels
    assert welford_kernel(kernel) == kernel
    assert _lowered(lambda x: shifted_var_mean(x), x) == once, "lowering twice gives equal kernel graphs"


def _welford_kernel(rows: int, length: int, statistic: str) -> Kernel:
    spec = BufferSpec.contiguous("out", torch.float32, (rows,))
    body = Welford((rows,), (length,), "welford", lambda ops, i, r: ops.load("x", length * i[0] + r[0]),
                   torch.float32, statistic=statistic)
    x = BufferSpec("x", torch.float32, (rows, length), (max(length, 1), 1))  # torch's strides of an empty x
    return Kernel("k", (ComputedBuffer(spec, body),), (x,), (spec,), ())


@pytest.mark.parametrize("length", [0, 1, 9])
@pytest.mark.parametrize("statistic", WELFORD_STATISTICS)
def test_welford_node_on_the_reference_evaluator(statistic, length):
    x = torch.randn(3, length) * 3 + 5
    (got,) = _welford_kernel(3, length, statistic)(x)
    mean = x.mean(-1)
    want = {"mean": mean, "m2": ((x - mean[:, None]) ** 2).sum(-1), "weight": torch.full((3,), float(length))}
    torch.testing.assert_close(got, want[statistic], equal_nan=True)


def test_welford_node_prints_and_checks_its_kind():
    text = str(_welford_kernel(2, 4, "m2"))
    assert "welford m2" in text and "reduce_welford(t0)" in text and "store(out, i0, t1.m2)" in text
    printer = Printer()
    assert printer.reduction("b", "welford", torch.float32, "t0") == ("t0.mean", "t0.m2", "t0.weight")
    with pytest.raises(ValueError, match="Welford node reduces with 'welford'"):
        Welford((2,), (4,), "sum", lambda ops, i, r: ops.load("x", 4 * i[0] + r[0]), torch.float32)
    with pytest.raises(ValueError, match="Welford node reduces with 'welford'"):
        Welford((2,), (4,), "welford", lambda ops, i, r: ops.load("x", 4 * i[0] + r[0]), torch.float32,
                statistic="variance")


def test_capability_is_off_unless_declared():
    assert Capabilities().welford is False
    assert REFERENCE_CODEGEN.capabilities.welford is False
    assert dataclasses.replace(Capabilities(), welford=True).welford
