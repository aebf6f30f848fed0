"""`match` and `PatternSet.match`: what matches, what does not, on Torch IR, ATen and prims."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.partition import Pattern, PatternSet, match

aten = torch.ops.aten


def names(matches) -> list[list[str]]:
    return [[n.name for n in m.graph_nodes()] for m in matches]


def relu_chain(x):
    for _ in range(5):
        x = torch.relu(x)
    return x


def double_relu(x):
    return torch.relu(torch.relu(x))


def test_matches_are_non_overlapping_back_to_back_and_deterministic():
    gm = fx.symbolic_trace(relu_chain)
    found = match(gm, double_relu)
    # Found from the end of the graph: relu_4 with relu_3, then relu_2 with relu_1.
    assert names(found) == [["relu_1", "relu_2"], ["relu_3", "relu_4"]]
    assert found[1].bindings == {"x": found[0].outputs[0]}  # reads the first match's output
    assert names(match(gm, double_relu)) == names(found)


def test_torch_ir_call_method_and_literal_arguments():
    def model(x):
        return x.sum(1).relu(), x.sum(0).relu()

    gm = fx.symbolic_trace(model)

    def summed(x):
        return x.sum(1).relu()

    exact = match(gm, summed)
    assert names(exact) == [["sum_1", "relu"]]
    assert exact[0].literals == {}
    wildcard = match(gm, Pattern(summed, literals="any"))
    assert names(wildcard) == [["sum_1", "relu"], ["sum_2", "relu_1"]]
    assert [m.literals for m in wildcard] == [{"sum_1.1": 1}, {"sum_1.1": 0}]


def test_placeholder_may_stand_for_a_literal_in_torch_ir():
    def model(x):
        return x * 0.5 + 1, x * 3

    def scaled_shift(x, scale, shift):
        return x * scale + shift

    (found,) = match(fx.symbolic_trace(model), scaled_shift)
    assert found.bindings["scale"] == 0.5 and found.bindings["shift"] == 1


def test_call_module_patterns_match_by_module_type():
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4), torch.nn.Tanh(),
        torch.nn.Linear(4, 2), torch.nn.ReLU(),
    )
    pattern = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.ReLU()))
    found = match(fx.symbolic_trace(model), pattern)
    assert [[n.target for n in m.graph_nodes()] for m in found] == [["0", "1"], ["4", "5"]]


def test_python_function_arguments_are_normalized_by_signature():
    # symbolic_trace records softmax(x, dim=-1, _stacklevel=3, dtype=None); Dynamo records
    # softmax(x, dim=-1). Both must match the same pattern; dim=0 must not.
    graph = fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(F.softmax, (x,), {"dim": -1})
    b = graph.call_function(F.softmax, (x, 0))
    graph.output((a, b))

    def pattern(x):
        return F.softmax(x, dim=-1)

    assert [m.anchor for m in match(graph, pattern)] == [a]


def test_aten_arguments_are_normalized_by_schema():
    graph = fx.Graph()
    x = graph.placeholder("x")
    explicit = graph.call_function(aten.sum.dim_IntList, (x, [1], False))
    kept = graph.call_function(aten.sum.dim_IntList, (x, [1]), {"keepdim": True})
    graph.output((explicit, kept))
    pattern = Pattern(lambda x: torch.sum(x, [1]), (torch.randn(2, 3),))
    assert [m.anchor for m in match(graph, pattern)] == [explicit]


def test_aten_pattern_on_make_fx_graph():
    def model(x, y):
        return torch.sigmoid(x * y) + torch.sigmoid(y * 2)

    gm = make_fx(model)(torch.randn(3), torch.randn(3))
    pattern = Pattern(lambda a, b: torch.sigmoid(a * b), (torch.randn(3), torch.randn(3)))
    assert pattern.ir == "aten"
    (found,) = match(gm, pattern)  # b stands for a tensor: it does not bind the literal 2
    assert [n.target for n in found.graph_nodes()] == [aten.mul.Tensor, aten.sigmoid.default]
    assert [v.name for v in found.bindings.values()] == ["x_1", "y_1"]


def test_aten_literals_exact_or_any():
    gm = make_fx(lambda x, y: torch.sigmoid(x * 2) + torch.sigmoid(y * 3))(
        torch.randn(3), torch.randn(3)
    )
    doubled = Pattern(lambda a: torch.sigmoid(a * 2), (torch.randn(3),))
    assert [m.bindings["a_1"].name for m in match(gm, doubled)] == ["x_1"]
    scaled = Pattern(doubled.module, literals="any")
    found = match(gm, scaled)
    assert [m.literals for m in found] == [{"mul.1": 2}, {"mul.1": 3}]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_prims_pattern_on_prims_graph():
    from torch._prims.context import TorchRefsMode

    def in_prims(fn):
        def traced(*args):
            with TorchRefsMode():
                return fn(*args)

        return traced

    gm = make_fx(in_prims(lambda x, y: torch.sigmoid(x * y) - y))(torch.randn(3), torch.randn(3))
    pattern = Pattern(in_prims(torch.sigmoid), (torch.randn(3),))
    assert {n.target.namespace for n in pattern.nodes} == {"prims"}
    (found,) = match(gm, pattern)
    assert [n.target for n in found.graph_nodes()] == [n.target for n in pattern.nodes]
    assert len(pattern.nodes) == 4  # sigmoid in prims: neg, exp, add, div
    assert [v.name for v in found.bindings.values()] == ["mul"]


def test_multi_output_pattern_found_through_users_of_matched_nodes():
    def model(x):
        h = x * 2
        return h.relu(), h.sin(), x.sin()

    def pattern(x):
        h = x * 2
        return h.relu(), h.sin()

    (found,) = match(fx.symbolic_trace(model), pattern)
    assert [n.name for n in found.outputs] == ["relu", "sin"]


def test_sibling_outputs_found_through_a_shared_input():
    def model(x, y):
        return torch.relu(x), torch.sigmoid(y), torch.sigmoid(x)

    def pattern(x):
        return torch.relu(x), torch.sigmoid(x)

    (found,) = match(fx.symbolic_trace(model), pattern)
    assert [n.name for n in found.outputs] == ["relu", "sigmoid_1"]


def test_intermediate_values_must_not_escape():
    def model(x):
        inner = torch.relu(x)
        return torch.relu(inner), inner + 1

    gm = fx.symbolic_trace(model)
    assert match(gm, double_relu) == []

    def exported(x):  # the same computation, but the pattern outputs the inner value too
        inner = torch.relu(x)
        return torch.relu(inner), inner

    assert names(match(gm, exported)) == [["relu", "relu_1"]]


def test_multi_output_match_must_be_convex():
    # y depends on relu(x), one of the outputs, and feeds add(x, y), the other: rewriting
    # both outputs at once would need y before and after the replacement.
    def model(x):
        a = torch.relu(x)
        y = torch.cumsum(a, 0)
        return torch.add(x, y), a

    def pattern(x, y):
        return torch.relu(x), torch.add(x, y)

    assert match(fx.symbolic_trace(model), pattern) == []


def test_view_and_reshape_match_each_other_when_nothing_is_mutated():
    def viewing(x):
        return x.view(-1).sin()

    def reshaping(x):
        return x.reshape(-1).sin()

    for model, pattern in ((viewing, reshaping), (reshaping, viewing)):
        assert len(match(fx.symbolic_trace(model), pattern)) == 1

    def mutating(x):
        y = x.view(-1).sin()
        x.add_(1)
        return y

    gm = fx.symbolic_trace(mutating)
    assert match(gm, reshaping) == []  # a copy where the graph has a view: not sound here
    assert len(match(gm, viewing)) == 1


def test_aten_view_unsafe_view_and_reshape_are_one_family():
    graph = fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(aten.reshape.default, (x, [6]))
    b = graph.call_function(aten._unsafe_view.default, (graph.call_function(aten.neg.default, (x,)), [6]))
    graph.output((graph.call_function(aten.exp.default, (a,)), graph.call_function(aten.exp.default, (b,))))
    pattern = Pattern(lambda t: torch.exp(t.view(6)), (torch.randn(2, 3),))
    assert [n.target for n in pattern.nodes] == [aten.view.default, aten.exp.default]
    assert len(match(graph, pattern)) == 2
    assert match(graph, Pattern(lambda t: torch.exp(t.view(3, 2)), (torch.randn(2, 3),))) == []


def test_check_predicate_filters_matches():
    gm = make_fx(lambda x, y: (x.relu(), y.relu()))(torch.randn(4), torch.randn(2, 2))
    wide = Pattern(torch.relu, (torch.randn(4),), check=lambda m: m.anchor.meta["val"].dim() == 2)
    (found,) = match(gm, wide)
    assert [v.name for v in found.bindings.values()] == ["y_1"]


def test_pattern_set_walks_once_and_earlier_entries_win():
    gm = fx.symbolic_trace(lambda x: torch.relu(torch.relu(torch.sin(x))))
    single = Pattern(lambda x: torch.relu(x), name="single")
    double = Pattern(double_relu)
    found = PatternSet([double, single]).match(gm)
    assert [(m.pattern.name, [n.name for n in m.graph_nodes()]) for m in found] == [
        ("double_relu", ["relu", "relu_1"])
    ]
    found = PatternSet([single, double]).match(gm)
    assert [m.pattern.name for m in found] == ["single", "single"]
    assert len(PatternSet([single]) + PatternSet([double])) == 2


def test_get_attr_constants_match_by_value():
    class WithConstant(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            self.register_buffer("c", torch.tensor([value, 2.0]))

        def forward(self, x):
            return x * self.c

    gm = fx.symbolic_trace(WithConstant(1.0))
    assert len(match(gm, fx.symbolic_trace(WithConstant(1.0)))) == 1
    assert match(gm, fx.symbolic_trace(WithConstant(5.0))) == []


def test_pattern_errors_name_the_problem():
    with pytest.raises(ValueError, match="output .* is an input"):
        Pattern(lambda x: (torch.relu(x), x))
    t = torch.randn(3)
    with pytest.raises(ValueError, match="same tensor twice"):
        Pattern(operator.add, (t, t))
    with pytest.raises(ValueError, match="literals"):
        Pattern(torch.relu, literals="maybe")
