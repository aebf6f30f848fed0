"""Eval batch norms folded into the channels-last CPU convolution before them, a ReLU / hardtanh
after them run as oneDNN's post-op (`conv_batch_norm.py`): eager's values (to float32 rounding)
and strides, parameters read on every call, and every case the pass must leave alone."""

from __future__ import annotations

import pytest
import torch

from kiln import autograd_trace
from kiln.integration import backend, explain
from kiln.integration._internal import conv_batch_norm

pytestmark = pytest.mark.skipif(conv_batch_norm._fused_conv() is None,
                                reason="this torch build has no oneDNN convolution with post-ops")

FUSED = "mkldnn._convolution_pointwise.default"
CONV = "aten.convolution.default"
CL = torch.channels_last


class Block(torch.nn.Module):
    def __init__(self, act=None, bias=False, affine=True, groups=1):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1, bias=bias, groups=groups)
        self.bn = torch.nn.BatchNorm2d(16, affine=affine)
        self.act = act
        with torch.no_grad():  # statistics and affine parameters far from their initial values
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            if affine:
                self.bn.weight.uniform_(0.5, 1.5)
                self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = self.bn(self.conv(x))
        return self.act(y) if self.act is not None else y


def _ops(fn, *args):
    report = explain(fn, *args, options={"fallback": False})
    return [f.op for f in report.fallback_nodes], report


def _check(fn, *args):
    torch._dynamo.reset()
    calls = []

    def counting(gm, example_inputs):
        calls.append(1)
        return backend(gm, example_inputs, options={"fallback": False})

    got, want = torch.compile(fn, backend=counting)(*args), fn(*args)
    assert calls, "kiln was never called"
    for g, w in zip(*((got, want) if isinstance(want, tuple) else ((got,), (want,)))):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        assert g.stride() == w.stride(), (g.stride(), w.stride())


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(memory_format=CL)


@pytest.mark.parametrize("act, attr", [(torch.nn.ReLU(), "relu"), (torch.nn.ReLU6(), "hardtanh"),
                                       (torch.nn.Hardtanh(-0.5, 2.0), "hardtanh"), (None, "none")])
@pytest.mark.parametrize("bias, affine, groups", [(False, True, 1), (True, False, 1), (True, True, 4)])
def test_conv_batch_norm_activation_is_one_onednn_call_with_eager_values(act, attr, bias, affine, groups):
    block = Block(act, bias, affine, groups).to(memory_format=CL).eval()
    x = _x(2, 8, 9, 7)
    with torch.no_grad():
        ops, report = _ops(block, x)
        assert ops == [FUSED], str(report)  # no convolution, batch norm or activation left
        assert report.kernel_count >= 1  # the folded weights and bias: kiln kernels
        _check(block, x)


def test_the_post_op_is_the_activation_found():
    block = Block(torch.nn.ReLU6()).to(memory_format=CL).eval()
    graphs = []

    def record(gm, example_inputs):
        aten = autograd_trace.trace_inference(gm, example_inputs)
        assert conv_batch_norm.fold_conv_batch_norms(aten) == 1
        graphs.append(aten)
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(block, backend=record)(_x(2, 8, 5, 5))
    (fused,) = [n for n in graphs[0].graph.nodes if str(n.target) == FUSED]
    assert fused.args[7:9] == ("hardtanh", [0.0, 6.0])
    assert not [n for n in graphs[0].graph.nodes if "batch_norm" in str(n.target) or "hardtanh" in str(n.target)]


def test_parameters_and_statistics_are_read_on_every_call():
    """The fold runs on every call (no freezing): changed weights, statistics or affine
    parameters give eager's new values with no recompile."""
    block = Block(torch.nn.ReLU()).to(memory_format=CL).eval()
    x = _x(2, 8, 6, 6)
    torch._dynamo.reset()
    calls = []
    compiled = torch.compile(block, backend=lambda gm, ex: calls.append(1) or backend(gm, ex, options={"fallback": False}))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), block(x), rtol=1e-4, atol=1e-4)
        block.conv.weight.mul_(-1.5)
        block.bn.running_var.add_(3.0)
        block.bn.running_mean.sub_(0.25)
        block.bn.bias.add_(1.0)
        torch.testing.assert_close(compiled(x), block(x), rtol=1e-4, atol=1e-4)
    assert len(calls) == 1


def test_a_batch_norm_output_read_elsewhere_is_folded_without_the_post_op():
    block = Block().to(memory_format=CL).eval()

    def fn(x):
        y = block(x)
        return torch.relu(y), y * 2

    x = _x(2, 8, 5, 6)
    with torch.no_grad():
        ops, report = _ops(fn, x)
        assert ops == [FUSED], str(report)
        _check(fn, x)


@pytest.mark.parametrize("case", ["contiguous", "train", "float64", "conv_read_twice", "transposed"])
def test_graphs_the_pass_leaves_alone(case):
    block = Block(torch.nn.ReLU()).eval()
    x = torch.randn(2, 8, 6, 6)
    fn = block
    if case != "contiguous":
        block = block.to(memory_format=CL)
        x = x.to(memory_format=CL)
        fn = block
    if case == "train":
        block.train()
    elif case == "float64":
        block, x = block.double(), x.double()
        fn = block
    elif case == "conv_read_twice":
        def fn(x):
            y = block.conv(x)
            return torch.relu(block.bn(y)) + y
    elif case == "transposed":
        deconv = torch.nn.ConvTranspose2d(8, 16, 3, padding=1).to(memory_format=CL)

        def fn(x):
            return torch.relu(block.bn(deconv(x)))
    with torch.no_grad():
        ops, report = _ops(fn, x)
        assert FUSED not in ops and CONV in ops, str(report)
        _check(fn, x)


def test_training_graphs_keep_the_convolution():
    """Eval batch norm in a graph that needs gradients: the backward differentiates the unfolded
    convolution, so nothing changes."""
    block = Block(torch.nn.ReLU()).to(memory_format=CL).eval()
    x = _x(2, 8, 5, 5)
    ops, report = _ops(block, x)
    assert FUSED not in ops and CONV in ops, str(report)


def test_the_pass_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(conv_batch_norm, "ENABLED", False)
    block = Block(torch.nn.ReLU()).to(memory_format=CL).eval()
    with torch.no_grad():
        ops, report = _ops(block, _x(2, 8, 5, 5))
    assert ops == [CONV], str(report)
