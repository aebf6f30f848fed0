"""`replace`, `PatternSet.apply` and `check_replacement`: structure, numerics and metadata."""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from kiln.partition import Pattern, PatternSet, check_replacement, replace

aten = torch.ops.aten


def calls(gm: fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op in ("call_function", "call_method")]


def with_vals(gm: fx.GraphModule, *inputs: torch.Tensor) -> fx.GraphModule:
    FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*inputs)
    return gm


def test_torch_ir_replacement_keeps_numerics_meta_and_order():
    def model(x):
        y = torch.sigmoid(x) * x  # silu, written out
        return torch.sigmoid(y) * y + 1

    x = torch.randn(5)
    gm = with_vals(fx.symbolic_trace(model), x)
    for node in gm.graph.nodes:
        node.meta["stack_trace"] = f"model.py: {node.name}"

    def silu(x):
        return torch.sigmoid(x) * x

    def fused(x):
        return torch.nn.functional.silu(x)

    done = replace(gm, silu, fused)
    gm.graph.lint()
    assert len(done) == 2 and calls(gm) == ["silu", "silu_1", "add"]
    first, second = [n for n in gm.graph.nodes if n.name.startswith("silu")]
    assert second.args == (first,)  # back to back: the second reads the first replacement
    assert first.meta["stack_trace"] == "model.py: mul" and first.meta["kiln_pattern"] == "silu"
    assert first.meta["val"].shape == (5,)  # propagated on fake values
    assert done[0].replacements == (first,)
    torch.testing.assert_close(gm(x), model(x))


def test_aten_replacement_is_traced_per_match_with_its_shapes():
    def model(x, y):
        return torch.exp(x).sum(), torch.exp(y).sum()

    gm = make_fx(model)(torch.randn(2, 3), torch.randn(5))
    pattern = Pattern(lambda t: torch.exp(t).sum(), (torch.randn(4),))

    def flattened(t):  # a replacement whose trace bakes in the shape it sees
        return torch.exp(t.reshape(t.numel())).sum()

    done = replace(gm, pattern, flattened)
    gm.graph.lint()
    assert len(done) == 2
    views = [n for n in gm.graph.nodes if n.target is aten.view.default]
    assert [n.args[1] for n in views] == [[6], [5]]
    assert all("val" in n.meta for n in gm.graph.nodes if n.op == "call_function")
    x, y = torch.randn(2, 3), torch.randn(5)
    torch.testing.assert_close(gm(x, y), model(x, y))


def test_back_to_back_matches_all_rewrite_correctly():
    def chain(x):
        for _ in range(6):
            x = torch.relu(x) - 0.5
        return x

    gm = make_fx(chain)(torch.randn(7))
    pattern = Pattern(lambda t: torch.relu(t) - 0.5, (torch.randn(7),))
    done = replace(gm, pattern, lambda t: torch.clamp(t, min=0) - 0.5)
    gm.graph.lint()
    assert len(done) == 6
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [
        aten.clamp.default, aten.sub.Tensor
    ] * 6
    x = torch.randn(7)
    torch.testing.assert_close(gm(x), chain(x))


def test_graph_replacement_with_a_constant_is_copied_into_the_module():
    class Offset(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("offset", torch.tensor([1.0, -1.0]))

        def forward(self, x):
            return torch.abs(x) + self.offset

    gm = fx.symbolic_trace(lambda x: torch.relu(x) * 3)

    def relu(x):
        return torch.relu(x)

    replace(gm, relu, fx.symbolic_trace(Offset()))
    gm.graph.lint()
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert len(attrs) == 1 and torch.equal(getattr(gm, attrs[0].target), torch.tensor([1.0, -1.0]))
    x = torch.randn(2)
    torch.testing.assert_close(gm(x), (torch.abs(x) + torch.tensor([1.0, -1.0])) * 3)


def test_multi_output_replacement_with_inputs_after_the_first_output():
    # Pattern outputs relu(x) (early) and add(x, y) (late, y computed in between). The
    # replacement must go after y; `use`, which reads relu(x), must move after it.
    def model(x, z):
        a = torch.relu(x)
        use = a * 2
        y = torch.exp(z)
        return use, torch.add(x, y), torch.neg(use)

    def pattern(x, y):
        return torch.relu(x), torch.add(x, y)

    def replacement(x, y):
        return torch.clamp(x, min=0), x + y

    gm = fx.symbolic_trace(model)
    (done,) = replace(gm, pattern, replacement)
    gm.graph.lint()
    assert calls(gm) == ["exp", "clamp", "add_1", "mul", "neg"]
    x, z = torch.randn(4), torch.randn(4)
    for got, want in zip(gm(x, z), model(x, z)):
        torch.testing.assert_close(got, want)


def test_pattern_set_applies_several_patterns_in_one_walk():
    def model(x, y):
        return torch.neg(torch.neg(x)) + torch.relu(torch.relu(y))

    gm = make_fx(model)(torch.randn(3), torch.randn(3))
    t = (torch.randn(3),)
    rules = PatternSet()
    rules.add(Pattern(lambda a: torch.neg(torch.neg(a)), t, name="double_neg"), lambda a: a * 1)
    rules.add(Pattern(lambda a: torch.relu(torch.relu(a)), t, name="double_relu"), torch.relu)
    rules.add(Pattern(lambda a: torch.exp(a), t, name="unused"))  # match-only: never applied
    done = rules.apply(gm)
    assert sorted(m.pattern.name for m in done) == ["double_neg", "double_relu"]
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [
        aten.mul.Tensor, aten.relu.default, aten.add.Tensor
    ]
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(gm(x, y), model(x, y))


def test_replacement_errors_name_the_pattern():
    gm = fx.symbolic_trace(lambda x: torch.relu(x) + 1)

    def relu(x):
        return torch.relu(x)

    def two_inputs(x, y):
        return x + y

    with pytest.raises(ValueError, match="replacement for pattern relu has signature \\(x, y\\)"):
        replace(gm, relu, two_inputs)
    with pytest.raises(ValueError, match="replacement for pattern relu takes 2 inputs"):
        replace(gm, relu, fx.symbolic_trace(two_inputs))

    def two_outputs(x):
        return x.sin(), x.cos()

    with pytest.raises(ValueError, match="returns 2 values; the pattern has 1"):
        replace(gm, relu, two_outputs)

    gm = make_fx(lambda x: torch.relu(x) + 1)(torch.randn(2))
    for node in gm.graph.nodes:
        node.meta.pop("val", None)
    with pytest.raises(ValueError, match="node 'x_1' it reads has no meta\\['val'\\]"):
        replace(gm, Pattern(relu, (torch.randn(2),)), torch.abs)


def test_check_replacement_accepts_equal_and_reports_different():
    def silu(x):
        return torch.sigmoid(x) * x

    example = (torch.randn(3, 4),)
    good = check_replacement(silu, torch.nn.functional.silu, example)
    assert good and good.trials == 3 and good.max_abs_error < 1e-5
    bad = check_replacement(Pattern(silu, example), torch.sigmoid, example)
    assert not bad and "trial 0" in bad.message and bad.max_abs_error > 0

    def add_in_place(x, y):
        return x.add_(y)

    # Same return value, but only the pattern writes into x: the check compares inputs too.
    assert not check_replacement(add_in_place, torch.add, (torch.randn(3), torch.randn(3)))

    def gather_rows(table, index):
        return table[index]

    rows = (torch.randn(5, 2), torch.tensor([0, 4, 2]))
    assert check_replacement(gather_rows, lambda t, i: t.index_select(0, i), rows)
