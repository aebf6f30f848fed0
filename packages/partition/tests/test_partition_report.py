"""Why regions were split, what stayed outside, tag predicates, Dynamo metadata, laziness."""

from __future__ import annotations

import operator
import random

import networkx as nx
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from kiln.partition import (
    Supported,
    partition,
    supports_dtypes,
    supports_ops,
    supports_tags,
    verify,
)

aten = torch.ops.aten
POINTWISE = supports_tags({torch.Tag.pointwise})


def diamond(x):
    a = torch.relu(x)
    u = torch.cumsum(a, 0)  # unsupported
    b = torch.add(a, u).exp()  # reads a directly and through u
    c = torch.cumsum(b, 0).sin()  # reaches b only through the second cumsum
    return c


def test_split_reasons_name_the_unsupported_node_and_the_direct_read():
    gm = make_fx(diamond)(torch.randn(6))
    out = partition(gm, POINTWISE)
    report = out.meta["kiln_partition"]
    assert [r.nodes for r in report.regions] == [("relu",), ("add", "exp"), ("sin",)]
    assert [(s.region, s.after, s.reason) for s in report.splits] == [
        ("kiln_region_1", "kiln_region_0", "cycle avoidance"),
        ("kiln_region_2", "kiln_region_1", "unsupported node"),
    ]
    cycle, unsupported = report.splits
    assert "add reads relu directly and also through cumsum" in cycle.detail
    assert unsupported.detail.startswith("cumsum_1 (aten.cumsum.default: not supported")
    assert report.split_counts() == {"cycle avoidance": 1, "unsupported node": 1}
    assert "regions split by: cycle avoidance x1, unsupported node x1" in str(report)
    x = torch.randn(6)
    torch.testing.assert_close(out(x), diamond(x))


def test_min_size_splits_and_outside_lists_every_node_left_out():
    gm = make_fx(diamond)(torch.randn(6))
    out = partition(gm, POINTWISE, min_size=2)
    report = out.meta["kiln_partition"]
    assert [r.nodes for r in report.regions] == [("add", "exp")]
    min_size = [(s.region, s.detail) for s in report.splits if s.reason == "min_size"]
    assert min_size == [("dissolved_0", "1 nodes < min_size=2"), ("dissolved_1", "1 nodes < min_size=2")]
    assert [(u.name, u.op) for u in report.outside] == [
        ("cumsum", "aten.cumsum.default"),
        ("cumsum_1", "aten.cumsum.default"),
        ("relu", "aten.relu.default"),
        ("sin", "aten.sin.default"),
    ]
    assert report.outside[2].reason == "min_size: its region has 1 < 2 nodes"
    x = torch.randn(6)
    torch.testing.assert_close(out(x), diamond(x))


def test_mutation_splits_are_reported_as_unsupported_nodes():
    def fn(x):
        a = torch.relu(x)
        x.add_(1)
        return a, torch.exp(x)

    out = partition(make_fx(fn)(torch.randn(4)), Supported(lambda n: True, "all"))
    (split,) = out.meta["kiln_partition"].splits
    assert split.reason == "unsupported node" and "add_ (aten.add_.Tensor: mutates an input)" in split.detail


def test_tag_predicate():
    gm = make_fx(lambda x: torch.relu(x).sum() + x.cumsum(0))(torch.randn(3))
    by_name = {n.name: n for n in gm.graph.nodes}
    assert POINTWISE(by_name["relu"]) and POINTWISE(by_name["add"])
    assert not POINTWISE(by_name["sum_1"]) and not POINTWISE(by_name["cumsum"])
    assert repr(POINTWISE) == "Supported(tags{pointwise})"
    traced = fx.symbolic_trace(lambda x: torch.relu(x))
    assert not any(POINTWISE(n) for n in traced.graph.nodes)


def test_dynamo_style_example_value_is_read_like_val():
    gm = fx.symbolic_trace(lambda x, i: (torch.relu(x) * 2, i + 1))
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        x, i = torch.empty(3), torch.empty(3, dtype=torch.long)
    values = {"x": x, "i": i}
    for node in gm.graph.nodes:  # Dynamo writes "example_value", not "val"
        if node.op == "placeholder":
            node.meta["example_value"] = values[node.name]
        elif node.op == "call_function":
            with mode:
                args = [a.meta["example_value"] if isinstance(a, fx.Node) else a for a in node.args]
                node.meta["example_value"] = node.target(*args)
    out = partition(gm, supports_dtypes({torch.float32}))
    verify(out)
    (sub,) = [m for m in out.children()]
    assert [n.target for n in sub.graph.nodes if n.op == "call_function"] == [torch.relu, operator.mul]
    real = (torch.randn(3), torch.arange(3))
    for got, want in zip(out(*real), gm(*real)):
        assert torch.equal(got, want)


def random_graph(size: int, seed: int) -> tuple[fx.GraphModule, frozenset[str]]:
    rng = random.Random(seed)
    graph = fx.Graph()
    values = [graph.placeholder(f"x{i}") for i in range(3)]
    for _ in range(size):
        low = max(0, len(values) - 20)
        if rng.random() < 0.5:
            pick = (values[rng.randrange(low, len(values))], values[rng.randrange(low, len(values))])
            values.append(graph.call_function(rng.choice((aten.add.Tensor, aten.mul.Tensor)), pick))
        else:
            values.append(graph.call_function(aten.tanh.default, (values[rng.randrange(low, len(values))],)))
    used = {s for v in values for s in v.all_input_nodes}
    graph.output(tuple(v for v in values[3:] if v not in used))
    refused = frozenset(v.name for v in values[3:] if rng.random() < 0.25)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    FakeTensorProp(gm).propagate(*[torch.randn(4) for _ in range(3)])
    return gm, refused


def test_large_random_graph_is_acyclic_ordered_exact_and_deterministic():
    gm, refused = random_graph(1500, seed=7)
    predicate = Supported(lambda n: n.name not in refused, "random")
    out = partition(gm, predicate)
    verify(out)
    report = out.meta["kiln_partition"]
    assert len(report.regions) > 10
    assert len(report.splits) == len(report.regions) - 1  # every later region says why
    region_of = {n: r.name for r in report.regions for n in r.nodes}
    dag = nx.DiGraph()
    for node in gm.graph.nodes:
        for source in node.all_input_nodes:
            a, b = region_of.get(source.name, source.name), region_of.get(node.name, node.name)
            if a != b:
                dag.add_edge(a, b)
    assert nx.is_directed_acyclic_graph(dag)
    inputs = [torch.randn(4) for _ in range(3)]
    torch.testing.assert_close(out(*inputs), gm(*inputs), rtol=0, atol=0)
    again = partition(gm, predicate)
    assert again.code == out.code
    assert [getattr(again, r.name).code for r in report.regions] == [
        getattr(out, r.name).code for r in report.regions
    ]


def test_modules_generate_code_lazily_but_behave_as_graph_modules():
    gm = make_fx(diamond)(torch.randn(6))
    out = partition(gm, supports_ops({aten.relu, aten.add, aten.exp, aten.sin}))
    assert isinstance(out, fx.GraphModule) and isinstance(out.kiln_region_0, fx.GraphModule)
    assert "kiln_region_0" in out.code and "relu" in out.kiln_region_0.code
    x = torch.randn(6)
    torch.testing.assert_close(out(x), diamond(x))
