"""inline_regions: region modules copied into the graph that calls them."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from kiln.integration._internal.flatten import inline_regions


class _Region(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, y):
        return x * self.weight + y, x - y


def _caller(use_whole_tuple: bool) -> fx.GraphModule:
    root = torch.nn.Module()
    root.region = fx.symbolic_trace(_Region())
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    pair = graph.call_module("region", (x, y))
    if use_whole_tuple:
        graph.output(pair)
    else:
        first = graph.call_function(operator.getitem, (pair, 0))
        second = graph.call_function(operator.getitem, (pair, 1))
        graph.output(graph.call_function(torch.add, (first, second)))
    return fx.GraphModule(root, graph)


def test_regions_are_inlined_and_parameters_stay_shared():
    gm = _caller(use_whole_tuple=False)
    weight = gm.region.weight
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    expected = gm(x, y)
    inline_regions(gm)
    assert not any(n.op == "call_module" for n in gm.graph.nodes)
    assert [p for p in gm.parameters()] == [weight]  # the same object, not a copy
    torch.testing.assert_close(gm(x, y), expected)
    with torch.no_grad():
        weight.add_(1.0)  # parameters are read at call time
    torch.testing.assert_close(gm(x, y), x * weight + y + (x - y))


def test_a_region_whose_whole_output_tuple_is_used_stays_a_call():
    gm = _caller(use_whole_tuple=True)
    inline_regions(gm)
    assert [n.op for n in gm.graph.nodes].count("call_module") == 1
