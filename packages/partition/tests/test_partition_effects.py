"""Mutation, side effects and randomness: what must never move or enter a region; verify()."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.partition import PartitionVerificationError, Supported, partition, verify

aten = torch.ops.aten
EVERYTHING = Supported(lambda node: True, "everything")


def region_nodes(gm: fx.GraphModule) -> set[str]:
    names = set()
    for node in gm.graph.nodes:
        if node.op == "call_module":
            sub = getattr(gm, node.target)
            names |= {n.name for n in sub.graph.nodes if n.op == "call_function"}
    return names


def run_both(fn, gm, out, *inputs):
    """Run eager and the partitioned module on separate copies; outputs and inputs must match."""
    eager_in = [t.clone() for t in inputs]
    part_in = [t.clone() for t in inputs]
    want, got = fn(*eager_in), out(*part_in)
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    for w, g in zip(eager_in, part_in):
        assert torch.equal(w, g)


def test_mutating_ops_never_enter_regions():
    def fn(x, y):
        z = y.relu()
        x.copy_(z)
        w = torch.exp(z)
        w.add_(1)
        return w * 2, x + 1

    gm = make_fx(fn)(torch.randn(4), torch.randn(4))
    out = partition(gm, EVERYTHING)
    verify(out)
    mutating = {
        n.name for n in gm.graph.nodes if n.target in (aten.copy_.default, aten.add_.Tensor)
    }
    assert len(mutating) == 2 and not mutating & region_nodes(out)
    report = out.meta["kiln_partition"]
    assert {(u.name, u.reason) for u in report.unsupported} == {
        (m, "mutates an input") for m in mutating
    }
    run_both(fn, gm, out, torch.randn(4), torch.randn(4))


def test_reads_before_a_mutation_stay_before_it():
    # relu(x) and exp(x) have the same depth; merged into one region placed at relu's spot,
    # exp would read x before add_ wrote it.
    def fn(x):
        a = torch.relu(x)
        x.add_(1)
        b = torch.exp(x)
        return a, b

    gm = make_fx(fn)(torch.randn(4))
    out = partition(gm, EVERYTHING)
    verify(out)
    assert len([n for n in out.graph.nodes if n.op == "call_module"]) == 2
    run_both(fn, gm, out, torch.randn(4))


def test_random_ops_keep_their_order():
    def fn(x):
        s = torch.sin(x)
        r1 = torch.rand(4)
        r2 = torch.rand(4)
        return s + r2, r1

    gm = make_fx(fn)(torch.randn(4))
    out = partition(gm, Supported(lambda n: n.name != "rand", "not the first rand"))
    verify(out)
    x = torch.randn(4)
    torch.manual_seed(0)
    want = fn(x)
    torch.manual_seed(0)
    got = out(x)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_side_effectful_asserts_keep_their_place():
    def fn(x):
        y = x.relu()
        torch._assert_async(torch.tensor(True))
        return y.exp(), x.cos()

    gm = make_fx(fn)(torch.randn(3))
    out = partition(gm, Supported(lambda n: "assert" not in str(n.target), "no asserts"))
    verify(out)
    order = [n.name for n in out.graph.nodes]
    assert order.index("_assert_async") < order.index("cos")  # cos came after the assert
    x = torch.randn(3)
    for w, g in zip(fn(x), out(x)):
        assert torch.equal(w, g)


def partitioned_example():
    gm = make_fx(lambda x: torch.cumsum(x.relu(), 0).exp())(torch.randn(3))
    return partition(gm, Supported(lambda n: n.target is not aten.cumsum.default, "no cumsum"))


def test_verify_names_a_node_without_val():
    out = partitioned_example()
    verify(out)
    exp = next(n for n in out.kiln_region_1.graph.nodes if n.name == "exp")
    del exp.meta["val"]
    with pytest.raises(
        PartitionVerificationError, match="region kiln_region_1: node 'exp'.*meta\\['val'\\]"
    ):
        verify(out)


def test_verify_rejects_non_tuple_output_and_bad_unpacking():
    out = partitioned_example()
    output = out.kiln_region_0.graph.output_node()
    output.args = (output.args[0][0],)
    with pytest.raises(PartitionVerificationError, match="expected a tuple"):
        verify(out)

    out = partitioned_example()
    relu = next(n for n in out.graph.nodes if n.name == "relu")
    relu.args = (relu.args[0], 3)
    with pytest.raises(PartitionVerificationError, match="'relu'.*index in \\[0, 1\\)"):
        verify(out)


def test_verify_rejects_mutation_inside_a_region_and_bad_order():
    out = partitioned_example()
    relu = next(n for n in out.kiln_region_0.graph.nodes if n.name == "relu")
    relu.target = aten.relu_.default
    with pytest.raises(PartitionVerificationError, match="'relu'.*mutates an input"):
        verify(out)

    out = partitioned_example()
    cumsum = next(n for n in out.graph.nodes if n.name == "cumsum")
    first_call = next(n for n in out.graph.nodes if n.op == "call_module")
    first_call.prepend(cumsum)
    with pytest.raises(
        PartitionVerificationError, match="'cumsum' uses 'relu' before it is defined"
    ):
        verify(out)


def test_verify_rejects_a_region_that_is_not_a_graph_module():
    out = partitioned_example()
    out.kiln_region_0 = torch.nn.ReLU()
    with pytest.raises(PartitionVerificationError, match="kiln_region_0.*not a GraphModule"):
        verify(out)


def collectives_program(a, b):
    c10d = torch.ops._c10d_functional
    x = a.relu() * 2
    first = c10d.all_reduce(x, "sum", "0")
    y = b.exp()
    second = c10d.all_reduce(y, "sum", "0")
    waited, waited_2 = c10d.wait_tensor(first), c10d.wait_tensor(second)
    c10d.all_reduce(y, "sum", "0")  # unused: every rank still issues it
    return waited.sin() + y.cos(), waited_2 + 1


def test_collectives_stay_out_of_regions_in_graph_order():
    gm = make_fx(collectives_program, tracing_mode="fake")(torch.randn(4), torch.randn(4))
    out = partition(gm, EVERYTHING)
    verify(out)
    collectives = [n for n in out.graph.nodes if n.op == "call_function" and "_c10d_functional" in str(n.target)]
    original = [n.name for n in gm.graph.nodes if n.op == "call_function" and "_c10d_functional" in str(n.target)]
    assert [n.name for n in collectives] == original  # none dropped, none moved past another
    assert not region_nodes(out) & set(original)
    position = {n: i for i, n in enumerate(out.graph.nodes)}
    for wait in (n for n in collectives if "wait_tensor" in str(n.target)):
        assert all(position[wait] < position[user] for user in wait.users)
    report = out.meta["kiln_partition"]
    assert "collective" in str(report)
