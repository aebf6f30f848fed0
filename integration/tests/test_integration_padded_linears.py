"""Linears with an unaligned number of outputs and a large weight (a language model's output
layer) get a zero-padded weight and a sliced output (`padded_linears.py`), on CUDA by default:
values and gradients are the unpadded linear's."""

from __future__ import annotations

import functools
import operator
import os
import subprocess
import sys

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

from kiln.integration import GraphReport, KilnOptions
from kiln.integration._internal import padded_linears, pipeline
from kiln.integration._internal.backend import _compile
from kiln.integration._internal.padded_linears import pad_linear_outputs, padded_outputs

OUTPUTS, INPUTS = 4099, 1024  # 4.2M weight elements: over MIN_WEIGHT_ELEMENTS, rows unaligned


def _dynamo_graph(fn, *args) -> tuple[fx.GraphModule, list]:
    graphs: list[tuple[fx.GraphModule, list]] = []

    def record(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm

    torch._dynamo.reset()
    torch.compile(fn, backend=record)(*args)
    (graph,) = graphs
    return graph


@pytest.fixture(autouse=True)
def enabled(monkeypatch):
    """The pass on (whatever KILN_PAD_LINEARS says in this process), for inputs of a few rows
    (the real rule wants MIN_ROWS tokens: `test_inputs_of_few_rows_are_left_alone` checks it)."""
    monkeypatch.setattr(padded_linears, "ENABLED", True)
    monkeypatch.setattr(padded_linears, "MIN_ROWS", 1)


def _linear_args(outputs=OUTPUTS, bias=True, device=None):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, INPUTS, generator=g, device="cpu").to(device)
    w = (torch.randn(outputs, INPUTS, generator=g, device="cpu") / INPUTS ** 0.5).to(device)
    return (x, w, torch.randn(outputs, generator=g, device="cpu").to(device)) if bias else (x, w)


def test_padded_outputs_are_multiples_of_16_bytes_in_2_byte_dtypes():
    assert padded_outputs(30522) == 30528
    assert padded_outputs(50257) == 50264
    assert padded_outputs(4096) == 4096


@pytest.mark.parametrize("bias", [True, False])
def test_a_large_unaligned_linear_gets_a_padded_weight_and_eager_gradients(bias):
    args = _linear_args(bias=bias, device="cpu")
    gm, inputs = _dynamo_graph(F.linear, *args)
    assert pad_linear_outputs(gm) == 0  # CUDA only by default: these are CPU tensors
    assert pad_linear_outputs(gm, devices=("cpu",)) == 1
    (wide,) = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch._C._nn.linear]
    weight = wide.args[1]
    assert weight.target is F.pad and weight.meta["example_value"].shape == (4104, INPUTS)
    (sliced,) = wide.users
    assert sliced.target is operator.getitem and sliced.meta["example_value"].shape == (6, OUTPUTS)
    leaves = [a.clone().requires_grad_() for a in inputs]
    reference = [a.clone().requires_grad_() for a in inputs]
    got, want = gm(*leaves)[0], F.linear(*reference)
    torch.testing.assert_close(got, want)
    grad = torch.randn_like(want)
    got.backward(grad)
    want.backward(grad)
    for mine, theirs in zip(leaves, reference):
        torch.testing.assert_close(mine.grad, theirs.grad)


@pytest.mark.parametrize("outputs", [4096, 37])
def test_aligned_or_small_linears_are_left_alone(outputs):
    gm, _ = _dynamo_graph(F.linear, *_linear_args(outputs, device="cpu"))
    before = gm.code
    assert pad_linear_outputs(gm, devices=("cpu",)) == 0 and gm.code == before


def test_inputs_of_few_rows_are_left_alone(monkeypatch):
    """A decoding step's few tokens: the matmul is bound by reading the weight, which the pad
    would copy."""
    monkeypatch.setattr(padded_linears, "MIN_ROWS", 7)
    gm, _ = _dynamo_graph(F.linear, *_linear_args(device="cpu"))
    assert pad_linear_outputs(gm, devices=("cpu",)) == 0
    monkeypatch.setattr(padded_linears, "MIN_ROWS", 6)
    assert pad_linear_outputs(gm, devices=("cpu",)) == 1


def test_the_pass_is_on_unless_turned_off(monkeypatch):
    monkeypatch.setattr(padded_linears, "ENABLED", False)
    gm, _ = _dynamo_graph(F.linear, *_linear_args(device="cpu"))
    assert pad_linear_outputs(gm, devices=("cpu",)) == 0
    code = "from kiln.integration._internal import padded_linears; print(padded_linears.ENABLED)"
    for value, expected in ((None, "True"), ("0", "False"), ("1", "True")):
        env = {k: v for k, v in os.environ.items() if k != "KILN_PAD_LINEARS"}
        if value is not None:
            env["KILN_PAD_LINEARS"] = value
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert result.stdout.strip() == expected, (value, result.stdout, result.stderr)


def _tanh_head(x, w, b, weights):
    return (F.linear(x, w, b).tanh() * weights).sum()


def _cross_entropy_head(x, w, b, labels):
    """A language model's loss: log-softmax's and nll_loss's backward over the padded logits."""
    return F.cross_entropy(F.linear(x, w, b), labels)


@pytest.mark.parametrize("head", [_tanh_head, _cross_entropy_head])
def test_a_padded_output_layer_trains_through_the_backend(monkeypatch, head):
    """Through the backend (fallback=False), forward and backward, the pass applied on this
    device too: the padded matmuls and the pad run compiled, and the output and every gradient
    are eager's."""
    device = torch.get_default_device()
    monkeypatch.setattr(pipeline, "pad_linear_outputs",
                        functools.partial(pad_linear_outputs, devices=("cpu", "cuda")))
    args = _linear_args(device=device)
    leaves = [a.clone().requires_grad_() for a in args]
    reference = [a.clone().requires_grad_() for a in args]
    g = torch.Generator().manual_seed(3)
    extra = (torch.randn(6, OUTPUTS, generator=g, device="cpu") if head is _tanh_head
             else torch.tensor([5, -100, 4098, 0, 17, 4097])).to(device)
    options = KilnOptions.create({"fallback": False})
    reports: list[GraphReport] = []
    torch._dynamo.reset()
    compiled = torch.compile(head, backend=lambda gm, example_inputs: _compile(gm, example_inputs, options,
                                                                                 reports.append))
    got = compiled(*leaves, extra)
    want = head(*reference, extra)
    got.backward()
    want.backward()
    assert reports, "kiln was never called"
    lowered = " ".join(name for report in reports for name in report.lowered_nodes)
    assert "constant_pad_nd" in lowered and "mm" in lowered, lowered
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for mine, theirs in zip(leaves, reference):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-4, rtol=1e-4)
