"""verify(): accepts trace_inference output, rejects hand-made graphs that break the contract."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

from kiln.autograd_trace import VerifyError, trace_inference, verify

aten = torch.ops.aten


def graph_module(build) -> torch.fx.GraphModule:
    """A GraphModule from ``build(graph, fake_mode)``; placeholders get a fake ``val``."""
    graph = torch.fx.Graph()
    fake_mode = FakeTensorMode()
    build(graph, fake_mode)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def placeholder(graph: torch.fx.Graph, fake_mode: FakeTensorMode, name: str) -> torch.fx.Node:
    node = graph.placeholder(name)
    node.meta["val"] = fake_mode.from_tensor(torch.empty(3))
    return node


def op(graph: torch.fx.Graph, target, args, fake_mode: FakeTensorMode) -> torch.fx.Node:
    node = graph.call_function(target, args)
    node.meta["val"] = fake_mode.from_tensor(torch.empty(3))
    return node


def test_verify_accepts_traced_graphs() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x.add_(1)
        return x.sum(-1), torch.max(x, 0)[0]

    traced = trace_inference(torch.fx.symbolic_trace(f), [torch.randn(2, 3)])
    verify(traced)  # must not raise


def test_verify_accepts_getitem_and_sym_arithmetic() -> None:
    def build(graph, fake_mode):
        x = placeholder(graph, fake_mode, "x")
        size = graph.call_function(aten.sym_size.int, (x, 0))
        size.meta["val"] = 3
        doubled = graph.call_function(operator.mul, (size, 2))
        parts = graph.call_function(aten.split.Tensor, (x, 1))
        parts.meta["val"] = [fake_mode.from_tensor(torch.empty(1))] * 3
        first = graph.call_function(operator.getitem, (parts, 0))
        first.meta["val"] = fake_mode.from_tensor(torch.empty(1))
        graph.output((first, doubled))

    verify(graph_module(build))


def test_non_aten_target_is_rejected_by_name() -> None:
    def build(graph, fake_mode):
        x = placeholder(graph, fake_mode, "x")
        graph.output((op(graph, torch.relu, (x,), fake_mode),))

    with pytest.raises(VerifyError, match="'relu'.*not an ATen OpOverload"):
        verify(graph_module(build))


def test_overload_packet_is_rejected() -> None:
    def build(graph, fake_mode):
        x = placeholder(graph, fake_mode, "x")
        graph.output((op(graph, aten.relu, (x,), fake_mode),))

    with pytest.raises(VerifyError, match="OpOverloadPacket"):
        verify(graph_module(build))


def test_call_method_is_rejected() -> None:
    def build(graph, fake_mode):
        x = placeholder(graph, fake_mode, "x")
        graph.output((graph.call_method("relu", (x,)),))

    with pytest.raises(VerifyError, match="call_method"):
        verify(graph_module(build))


def test_inplace_op_in_the_middle_is_rejected() -> None:
    def build(graph, fake_mode):
        x = placeholder(graph, fake_mode, "x")
        y = op(graph, aten.mul.Tensor, (x, 2), fake_mode)
        z = op(graph, aten.add_.Tensor, (y, 1), fake_mode)
        graph.output((z,))

    with pytest.raises(VerifyError, match="aten.add_.Tensor.*mutates"):
        verify(graph_module(build))


def test_out_variant_is_rejected() -> None:
    def build(graph, fake_mode):
        x = placeholder(graph, fake_mode, "x")
        buf = op(graph, aten.empty_like.default, (x,), fake_mode)
        node = graph.call_function(aten.add.out, (x, x), {"out": buf})
        node.meta["val"] = buf.meta["val"]
        graph.output((node,))

    with pytest.raises(VerifyError, match="mutates"):
        verify(graph_module(build))


def test_computation_after_input_writeback_is_rejected() -> None:
    def build(graph, fake_mode):
        x = placeholder(graph, fake_mode, "x")
        y = op(graph, aten.mul.Tensor, (x, 2), fake_mode)
        op(graph, aten.copy_.default, (x, y), fake_mode)
        late = op(graph, aten.sin.default, (x,), fake_mode)
        graph.output((late,))

    with pytest.raises(VerifyError, match="aten.sin.default.*after the input write-backs"):
        verify(graph_module(build))


def test_copy_into_an_intermediate_is_rejected() -> None:
    def build(graph, fake_mode):
        x = placeholder(graph, fake_mode, "x")
        y = op(graph, aten.mul.Tensor, (x, 2), fake_mode)
        op(graph, aten.copy_.default, (y, x), fake_mode)
        graph.output((y,))

    with pytest.raises(VerifyError, match="aten.copy_.default.*mutates"):
        verify(graph_module(build))


def test_missing_val_is_rejected_by_name() -> None:
    def build(graph, fake_mode):
        x = placeholder(graph, fake_mode, "x")
        graph.output((graph.call_function(aten.cos.default, (x,)),))

    with pytest.raises(VerifyError, match='aten.cos.default.*meta\\["val"\\]'):
        verify(graph_module(build))


def test_missing_placeholder_val_is_rejected() -> None:
    def build(graph, fake_mode):
        graph.output((graph.placeholder("x"),))

    with pytest.raises(VerifyError, match="'x'"):
        verify(graph_module(build))


def test_hidden_batch_norm_mutation_is_rejected() -> None:
    def build(graph, fake_mode):
        x, mean, var = (placeholder(graph, fake_mode, n) for n in ("x", "mean", "var"))
        bn = graph.call_function(
            aten.native_batch_norm.default, (x, None, None, mean, var, True, 0.1, 1e-5)
        )
        bn.meta["val"] = (x.meta["val"],) * 3
        out = graph.call_function(operator.getitem, (bn, 0))
        out.meta["val"] = x.meta["val"]
        graph.output((out,))

    with pytest.raises(VerifyError, match="native_batch_norm.*running_mean"):
        verify(graph_module(build))


def test_error_message_quotes_user_source() -> None:
    def build(graph, fake_mode):
        x = placeholder(graph, fake_mode, "x")
        bad = op(graph, torch.sin, (x,), fake_mode)
        bad.meta["stack_trace"] = '  File "net.py", line 7, in forward\n    return torch.sin(x)\n'
        graph.output((bad,))

    with pytest.raises(VerifyError, match='File "net.py", line 7'):
        verify(graph_module(build))
