"""Property test: random DAGs of binary/unary/in-place ops with a random unsupported subset."""

from __future__ import annotations

import operator

import networkx as nx
import torch
import torch.fx as fx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.partition import Supported, partition, verify

OPS = {
    "add": torch.add,
    "mul": torch.mul,
    "sub": torch.sub,
    "relu": lambda a, b: torch.relu(a),
    "neg": lambda a, b: torch.neg(a),
    "add_": lambda a, b: a.add_(b),  # in place: later reads see the new value
}


@st.composite
def programs(draw):
    n_inputs = draw(st.integers(1, 3))
    steps = []
    for k in range(draw(st.integers(1, 12))):
        live = n_inputs + k
        op = draw(st.sampled_from(sorted(OPS)))
        steps.append((op, draw(st.integers(0, live - 1)), draw(st.integers(0, live - 1))))
    n_values = n_inputs + len(steps)
    outputs = draw(st.lists(st.integers(0, n_values - 1), min_size=1, max_size=3))
    unsupported = draw(st.sets(st.integers(0, len(steps) - 1)))
    min_size = draw(st.integers(1, 3))
    return n_inputs, steps, outputs, unsupported, min_size


def program_fn(steps, outputs):
    def fn(*inputs):
        values = list(inputs)
        for op, i, j in steps:
            values.append(OPS[op](values[i], values[j]))
        return tuple(values[k] for k in outputs)

    return fn


def condensation_is_acyclic(original: fx.GraphModule, out: fx.GraphModule) -> bool:
    group = {n.name: n.name for n in original.graph.nodes}
    for node in out.graph.nodes:
        if node.op == "call_module":
            for inner in getattr(out, node.target).graph.nodes:
                if inner.op == "call_function":
                    group[inner.name] = node.target
    dag = nx.DiGraph()
    dag.add_nodes_from(set(group.values()))
    for node in original.graph.nodes:
        for source in node.all_input_nodes:
            if group[source.name] != group[node.name]:
                dag.add_edge(group[source.name], group[node.name])
    return nx.is_directed_acyclic_graph(dag)


def region_members(out: fx.GraphModule) -> list[list[str]]:
    return [
        [n.name for n in getattr(out, node.target).graph.nodes if n.op == "call_function"]
        for node in out.graph.nodes
        if node.op == "call_module"
    ]


def all_code(gm: fx.GraphModule) -> list[str]:
    return [gm.code] + [
        m.code for _, m in sorted(gm.named_children()) if isinstance(m, fx.GraphModule)
    ]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**16))
# A write-after-read hazard found by this test when ordering edges were missing: the two
# `add`s have equal depth and would merge into one region running before `add_`.
@example(program=(1, [("add", 0, 0), ("add_", 0, 0), ("add", 0, 0)], [1], set(), 1), seed=0)
def test_random_dag_partition_is_valid_and_exact(program, seed):
    n_inputs, steps, outputs, unsupported, min_size = program
    fn = program_fn(steps, outputs)
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(3, generator=gen) for _ in range(n_inputs)]
    gm = make_fx(fn)(*[t.clone() for t in inputs])
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    refused = {calls[k].name for k in unsupported if k < len(calls)}
    predicate = Supported(lambda node: node.name not in refused, "random subset")

    out = partition(gm, predicate, min_size=min_size)
    verify(out)
    assert condensation_is_acyclic(gm, out)

    # Every call node ends up exactly once, inside a region only if it may be there.
    members = region_members(out)
    inside = [name for region in members for name in region]
    assert len(inside) == len(set(inside)) and all(len(r) >= min_size for r in members)
    eligible = {
        n.name for n in calls if n.name not in refused and n.target != torch.ops.aten.add_.Tensor
    }
    assert set(inside) <= eligible
    if min_size == 1:
        assert set(inside) == eligible
    outside = [
        n.name
        for n in out.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem
    ]
    assert sorted(inside + outside) == sorted(n.name for n in calls)

    # Same outputs and same input mutations as the original graph.
    eager_inputs = [t.clone() for t in inputs]
    part_inputs = [t.clone() for t in inputs]
    want, got = gm(*eager_inputs), out(*part_inputs)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(part_inputs, eager_inputs, rtol=0, atol=0, equal_nan=True)

    assert all_code(partition(gm, predicate, min_size=min_size)) == all_code(out)
