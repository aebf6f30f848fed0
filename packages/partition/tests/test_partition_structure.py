"""Structure and numerics of `partition` on small hand-built ATen and Torch IR graphs."""

from __future__ import annotations

import operator
import pathlib

import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from kiln.partition import PartitionReport, Supported, partition, supports_ops, verify

aten = torch.ops.aten


def regions(gm: fx.GraphModule) -> dict[str, list[str]]:
    """Region submodule name -> names of its call nodes, in the order the parent calls them."""
    found = {}
    for node in gm.graph.nodes:
        if node.op == "call_module" and str(node.target).startswith("kiln_region_"):
            sub = getattr(gm, node.target)
            found[node.target] = [n.name for n in sub.graph.nodes if n.op == "call_function"]
    return found


def parent_calls(gm: fx.GraphModule) -> list[str]:
    return [
        n.name
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem
    ]


def cumsum_example():
    fn = lambda x: torch.cumsum(torch.relu(x) + 1, 0).exp() * 2  # noqa: E731
    return fn, make_fx(fn)(torch.randn(5))


def test_chain_around_unsupported_op_gives_two_regions():
    fn, gm = cumsum_example()
    out = partition(gm, supports_ops({aten.relu, aten.add, aten.exp, aten.mul}))
    verify(out)
    assert regions(out) == {"kiln_region_0": ["relu", "add"], "kiln_region_1": ["exp", "mul"]}
    assert parent_calls(out) == ["cumsum"]
    cumsum = next(n for n in out.graph.nodes if n.name == "cumsum")
    assert cumsum.target is aten.cumsum.default and cumsum.args[1] == 0
    x = torch.randn(5)
    assert torch.equal(out(x), fn(x))


def test_region_output_is_always_a_tuple_unpacked_by_getitem():
    _, gm = cumsum_example()
    out = partition(gm, supports_ops({aten.relu, aten.add, aten.exp, aten.mul}))
    for name in ("kiln_region_0", "kiln_region_1"):
        sub = getattr(out, name)
        assert isinstance(sub, fx.GraphModule)
        assert isinstance(sub.graph.output_node().args[0], tuple)
        (call,) = [n for n in out.graph.nodes if n.target == name]
        assert [(u.target, u.args[1]) for u in call.users] == [(operator.getitem, 0)]
    # The getitem nodes carry the names and meta of the values they stand for.
    add = next(n for n in out.graph.nodes if n.name == "add")
    assert add.target is operator.getitem and add.meta["val"].shape == (5,)


def test_report_lists_regions_and_unsupported_nodes():
    _, gm = cumsum_example()
    out = partition(gm, supports_ops({aten.relu, aten.add, aten.exp, aten.mul}))
    report = out.meta["kiln_partition"]
    assert isinstance(report, PartitionReport)
    assert [(r.name, r.num_nodes) for r in report.regions] == [
        ("kiln_region_0", 2),
        ("kiln_region_1", 2),
    ]
    assert report.regions[0].op_counts == (("aten.add.Tensor", 1), ("aten.relu.default", 1))
    assert [(u.name, u.op, u.reason) for u in report.unsupported] == [
        ("cumsum", "aten.cumsum.default", "not supported by predicate")
    ]
    text = str(report)
    assert "kiln_region_1" in text and "aten.cumsum.default" in text and "not supported" in text
    assert "kiln_partition" not in gm.meta  # the input is left alone


def test_meta_is_copied_into_regions_and_onto_placeholders():
    _, gm = cumsum_example()
    for node in gm.graph.nodes:
        node.meta["stack_trace"] = f"File 'user.py', line 1, in {node.name}"
    out = partition(gm, supports_ops({aten.relu, aten.add, aten.exp, aten.mul}))
    sub = out.kiln_region_1
    placeholder, exp, mul = [n for n in sub.graph.nodes if n.op != "output"]
    original = {n.name: n for n in gm.graph.nodes}
    assert (
        placeholder.name == "cumsum" and placeholder.meta["val"] is original["cumsum"].meta["val"]
    )
    assert placeholder.meta["stack_trace"].endswith("in cumsum")
    assert exp.meta["val"] is original["exp"].meta["val"]
    assert mul.meta["stack_trace"].endswith("in mul")


def test_diamond_through_unsupported_node_splits_regions():
    # a -> u -> c and a -> c: putting a and c together would need u both before and after.
    def fn(x):
        a = torch.relu(x)
        u = torch.cumsum(a, 0)
        return torch.add(a, u).exp()

    gm = make_fx(fn)(torch.randn(6))
    out = partition(gm, supports_ops({aten.relu, aten.add, aten.exp}))
    verify(out)
    assert regions(out) == {"kiln_region_0": ["relu"], "kiln_region_1": ["add", "exp"]}
    x = torch.randn(6)
    assert torch.equal(out(x), fn(x))


def test_independent_regions_of_equal_depth_merge_horizontally():
    def fn(x, y):
        p = torch.cumsum(torch.relu(x), 0).exp()
        q = torch.cumsum(torch.sin(y), 0).cos()
        return p, q

    gm = make_fx(fn)(torch.randn(4), torch.randn(4))
    out = partition(gm, supports_ops({aten.relu, aten.sin, aten.exp, aten.cos}))
    verify(out)
    assert regions(out) == {"kiln_region_0": ["relu", "sin"], "kiln_region_1": ["exp", "cos"]}
    sub = out.kiln_region_0
    assert [n.name for n in sub.graph.nodes if n.op == "placeholder"] == ["x_1", "y_1"]
    assert len(sub.graph.output_node().args[0]) == 2
    x, y = torch.randn(4), torch.randn(4)
    for got, want in zip(out(x, y), fn(x, y)):
        assert torch.equal(got, want)


def test_min_size_dissolves_small_regions():
    fn, gm = cumsum_example()
    ops = supports_ops({aten.relu, aten.add, aten.exp, aten.mul})
    assert len(regions(partition(gm, ops, min_size=2))) == 2
    out = partition(gm, ops, min_size=3)
    verify(out)
    assert regions(out) == {}
    assert parent_calls(out) == ["relu", "add", "cumsum", "exp", "mul"]
    report = out.meta["kiln_partition"]
    assert [r.nodes for r in report.dissolved] == [("relu", "add"), ("exp", "mul")]
    assert report.regions == ()
    x = torch.randn(5)
    assert torch.equal(out(x), fn(x))
    with pytest.raises(ValueError, match="min_size"):
        partition(gm, ops, min_size=0)


def test_get_attr_is_copied_into_the_region_that_uses_it():
    const = torch.tensor([1.0, 2.0, 3.0])

    def fn(x):
        return torch.cumsum(x * const, 0) + const

    gm = make_fx(fn)(torch.randn(3))
    out = partition(gm, supports_ops({aten.mul, aten.lift_fresh_copy}))
    verify(out)
    (name,) = regions(out)
    sub = getattr(out, name)
    attrs = [n for n in sub.graph.nodes if n.op == "get_attr"]
    assert len(attrs) == 1 and torch.equal(getattr(sub, attrs[0].target), const)
    assert [n.name for n in sub.graph.nodes if n.op == "placeholder"] == ["x_1"]
    x = torch.randn(3)
    assert torch.equal(out(x), fn(x))


def test_multi_output_op_takes_its_getitems_along():
    def fn(x):
        var, mean = torch.var_mean(x, 0)
        return torch.cumsum(var, 0) + mean

    gm = make_fx(fn)(torch.randn(4, 3))
    out = partition(gm, supports_ops({aten.var_mean}))
    verify(out)
    (names,) = regions(out).values()
    assert names[0] == "var_mean" and len(names) == 3  # var_mean and both getitems
    assert torch.equal(out(torch.ones(4, 3)), fn(torch.ones(4, 3)))
    report = partition(gm, supports_ops({aten.add})).meta["kiln_partition"]
    assert {u.reason for u in report.unsupported if u.op == "operator.getitem"} == {
        "unpacks unsupported var_mean"
    }


class TorchIRModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Parameter(torch.full((4,), 3.0))

    def forward(self, x):
        y = self.lin(x).relu()
        z = torch.cumsum(y, 0)
        return (z * self.scale).add(1)


def test_torch_ir_with_modules_methods_and_parameters():
    module = TorchIRModule()
    gm = fx.symbolic_trace(module)
    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(torch.randn(2, 4))
    out = partition(gm, supports_ops({torch.nn.Linear, "relu", "add", operator.mul}))
    verify(out)
    sub0, sub1 = out.kiln_region_0, out.kiln_region_1
    assert [n.op for n in sub0.graph.nodes] == [
        "placeholder",
        "call_module",
        "call_method",
        "output",
    ]
    assert isinstance(sub0.lin, torch.nn.Linear) and sub0.lin.weight is module.lin.weight
    assert [n.op for n in sub1.graph.nodes if n.op != "placeholder"] == [
        "get_attr",
        "call_function",
        "call_method",
        "output",
    ]
    assert sub1.scale is module.scale
    assert not hasattr(out, "scale") and not hasattr(out, "lin")
    x = torch.randn(2, 4)
    assert torch.equal(out(x), module(x))


def test_predicate_errors_name_the_node():
    _, gm = cumsum_example()

    def broken(node):
        raise KeyError("boom")

    with pytest.raises(RuntimeError, match="raised on node 'relu'"):
        partition(gm, broken)


def test_partitioning_twice_is_deterministic_and_renames_nothing_twice():
    _, gm = cumsum_example()
    ops = supports_ops({aten.relu, aten.add, aten.exp, aten.mul})
    first, second = partition(gm, ops), partition(gm, ops)
    assert first.code == second.code
    assert str(first.meta["kiln_partition"]) == str(second.meta["kiln_partition"])
    for name in regions(first):
        assert getattr(first, name).code == getattr(second, name).code
    # Partitioning a partitioned graph must not reuse a taken submodule name.
    again = partition(first, supports_ops({aten.cumsum}))
    verify(again)
    assert set(regions(again)) == {"kiln_region_0", "kiln_region_1", "kiln_region_2"}
    assert regions(again)["kiln_region_2"] == ["cumsum"]
    x = torch.randn(5)
    assert torch.equal(again(x), gm(x))


def test_everything_supported_gives_one_region_and_nothing_supported_none():
    fn, gm = cumsum_example()
    everything = partition(gm, Supported(lambda n: True, "all"))
    assert list(regions(everything).values()) == [["relu", "add", "cumsum", "exp", "mul"]]
    nothing = partition(gm, ~Supported(lambda n: True, "all"))
    assert regions(nothing) == {} and parent_calls(nothing) == [
        "relu",
        "add",
        "cumsum",
        "exp",
        "mul",
    ]
    x = torch.randn(5)
    assert torch.equal(everything(x), fn(x)) and torch.equal(nothing(x), fn(x))


def test_readme_examples_run(capsys):
    readme = pathlib.Path(__file__).parents[1] / "README.md"
    blocks = [b.split("```", 1)[0] for b in readme.read_text().split("```python\n")[1:]]
    assert len(blocks) == 2
    for source in blocks:
        exec(compile(source, str(readme), "exec"), {})
    printed = capsys.readouterr().out
    assert "kiln_region_1" in printed and "aten.cumsum.default" in printed
    assert "Match(silu" in printed and "3 trials agree" in printed
