import operator

import pytest
import torch

from kiln.capture import VerificationError, capture, verify


def small(x):
    return torch.sin(x) * 2 + 1


def captured_small():
    return capture(small, torch.randn(3)).graphs[0]


def test_verify_accepts_dynamo_and_export_graphs():
    verify(captured_small())
    verify(capture(small, torch.randn(3), mode="export").graphs[0])


def test_missing_fake_value_on_used_node_names_the_node():
    graph = captured_small()
    (mul,) = [n for n in graph.gm.graph.nodes if n.target is operator.mul]
    del mul.meta["example_value"]
    with pytest.raises(VerificationError, match=rf"node '{mul.name}' \(operator.mul\)"):
        verify(graph)


def test_missing_fake_value_on_placeholder_names_it():
    graph = captured_small()
    (placeholder,) = [n for n in graph.gm.graph.nodes if n.op == "placeholder"]
    del placeholder.meta["example_value"]
    with pytest.raises(VerificationError, match=rf"placeholder '{placeholder.name}'"):
        verify(graph)


def test_input_count_mismatch_is_reported():
    graph = captured_small()
    with pytest.raises(VerificationError, match="1 placeholders .* but 2 example inputs"):
        verify(graph.gm, (torch.randn(3), torch.randn(3)))


def test_placeholder_dtype_mismatch_is_reported():
    graph = captured_small()
    with pytest.raises(VerificationError, match="torch.float32 of rank 1.*torch.int64 of rank 1"):
        verify(graph.gm, (torch.arange(3),))


def test_graph_that_does_not_lint_is_rejected():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(3)
    first = graph.call_function(torch.sin, (x,))
    second = graph.call_function(torch.cos, (x,))
    graph.output(first)
    first.args = (second,)  # sin now uses cos, which comes after it
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(VerificationError, match="does not lint"):
        verify(gm)
