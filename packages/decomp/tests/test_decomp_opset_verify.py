"""opset(), check_opset() and verify() on hand-built and traced graphs."""

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.decomp import (
    LOOP_LEVEL_OPS,
    OpsetError,
    VerifyError,
    check_opset,
    decompose,
    loop_level,
    opset,
    verify,
)

aten = torch.ops.aten


class _Model(torch.nn.Module):
    def forward(self, x):
        y = torch.var_mean(x, -1)[0]
        return F.gelu(x) + y.unsqueeze(-1)


def _traced(mode="fake"):
    return make_fx(_Model(), tracing_mode=mode, record_stack_traces=True)(torch.randn(3, 4))


def test_opset_counts_call_function_targets():
    gm = _traced()
    counts = opset(gm)
    assert counts[aten.var_mean.correction] == 1
    assert counts[aten.gelu.default] == 1
    assert counts["operator.getitem"] == 2
    assert sum(counts.values()) == sum(1 for n in gm.graph.nodes if n.op == "call_function")


def test_check_opset_names_nodes_ops_and_source_lines():
    gm = _traced()
    with pytest.raises(OpsetError) as info:
        check_opset(gm, {aten.add.Tensor, aten.unsqueeze.default})
    err = info.value
    assert sorted(n.op for n in err.nodes) == ["aten.gelu.default", "aten.var_mean.correction"]
    gelu = next(n for n in err.nodes if n.op == "aten.gelu.default")
    assert gelu.name == "gelu"
    assert "F.gelu(x)" in gelu.source and "line" in gelu.source
    message = str(err)
    assert "aten.gelu.default" in message and "var_mean" in message and "register" in message


def test_check_opset_accepts_packets_and_names():
    gm = _traced()
    check_opset(gm, [aten.var_mean, aten.gelu, aten.add, aten.unsqueeze])
    with pytest.raises(OpsetError, match="operator.getitem"):
        check_opset(
            gm, [aten.var_mean, aten.gelu, aten.add, aten.unsqueeze], ignore_structural=False
        )
    check_opset(
        gm,
        [aten.var_mean, aten.gelu, aten.add, aten.unsqueeze, "operator.getitem"],
        ignore_structural=False,
    )
    with pytest.raises(TypeError, match="allowed ops"):
        check_opset(gm, [42])


def test_symbolic_size_arithmetic_is_structural():
    gm = make_fx(lambda x: x.view(x.shape[0] * x.shape[1]), tracing_mode="symbolic")(
        torch.randn(3, 4)
    )
    counts = opset(gm)
    assert counts[aten.sym_size.int] == 2 and counts["operator.mul"] == 1
    check_opset(gm, {aten.view.default})
    with pytest.raises(OpsetError):
        check_opset(gm, {aten.view.default}, ignore_structural=False)


def test_input_write_back_is_structural_but_other_copies_are_not():
    from torch.func import functionalize

    def bump(x, y):
        x.add_(1)
        return (x * y).clone().copy_(y)

    gm = make_fx(functionalize(bump, remove="mutations_and_views"))(torch.randn(3), torch.randn(3))
    assert opset(gm)[aten.copy_.default] == 1  # the write-back into x
    check_opset(gm, {aten.add.Tensor, aten.mul.Tensor, aten.clone.default, aten.copy.default})
    with pytest.raises(OpsetError, match="copy_"):
        check_opset(
            gm,
            {aten.add.Tensor, aten.mul.Tensor, aten.clone.default, aten.copy.default},
            ignore_structural=False,
        )
    eager = make_fx(bump)(torch.randn(3), torch.randn(3))  # copy_ into an intermediate
    with pytest.raises(OpsetError, match="copy_"):
        check_opset(eager, {aten.add_.Tensor, aten.mul.Tensor, aten.clone.default})


def test_loop_level_output_passes_check_and_verify():
    for mode in ("fake", "symbolic"):
        out = decompose(_traced(mode), loop_level())
        check_opset(out, LOOP_LEVEL_OPS)
        verify(out)


def _graph_with(make_node):
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(3)
    node = make_node(graph, x)
    graph.output(node)
    return fx.GraphModule(torch.nn.Module(), graph)


def _node(gm, target):
    return next(n for n in gm.graph.nodes if n.target is target)


def test_verify_rejects_non_aten_targets():
    gm = _graph_with(lambda g, x: g.call_function(torch.relu, (x,)))
    with pytest.raises(VerifyError, match="node 'relu'.*not an OpOverload"):
        verify(gm)


def test_verify_rejects_missing_val():
    gm = _graph_with(lambda g, x: g.call_function(aten.relu.default, (x,)))
    name = _node(gm, aten.relu.default).name
    with pytest.raises(VerifyError, match=f"node '{name}'.*aten.relu.default.*no meta"):
        verify(gm)
    _node(gm, aten.relu.default).meta["val"] = torch.empty(3)
    verify(gm)


def test_verify_rejects_placeholder_without_val_and_wrong_val_type():
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(aten.relu.default, (x,)))
    with pytest.raises(VerifyError, match="node 'x'.*placeholder"):
        verify(fx.GraphModule(torch.nn.Module(), graph))
    gm = _graph_with(lambda g, x: g.call_function(aten.relu.default, (x,)))
    relu = _node(gm, aten.relu.default)
    relu.meta["val"] = (torch.empty(3),)
    with pytest.raises(VerifyError, match="expected a tensor"):
        verify(gm)


def test_verify_accepts_getitem_and_checks_its_val():
    def build(g, x):
        pair = g.call_function(aten.var_mean.correction, (x,))
        pair.meta["val"] = (torch.empty(()), torch.empty(()))
        return g.call_function(operator.getitem, (pair, 0))

    gm = _graph_with(build)
    with pytest.raises(VerifyError, match="getitem"):
        verify(gm)
    _node(gm, operator.getitem).meta["val"] = torch.empty(())
    verify(gm)


def test_verify_rejects_call_module():
    root = torch.nn.Module()
    root.inner = torch.nn.ReLU()
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(3)
    graph.output(graph.call_module("inner", (x,)))
    with pytest.raises(VerifyError, match="call_module 'inner'"):
        verify(fx.GraphModule(root, graph))
