"""trace_inference on standalone graphs: structure, meta and numerics against eager."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from kiln.autograd_trace import TraceError, trace_inference, verify

aten = torch.ops.aten


def call_targets(gm: torch.fx.GraphModule) -> list[object]:
    return [node.target for node in gm.graph.nodes if node.op == "call_function"]


def placeholder_names(gm: torch.fx.GraphModule) -> list[str]:
    return [node.name for node in gm.graph.nodes if node.op == "placeholder"]


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def test_mlp_with_call_module_leaves_traces_to_aten_and_matches_eager() -> None:
    model = MLP()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(3, 4)

    traced = trace_inference(gm, [x])

    verify(traced)
    targets = call_targets(traced)
    assert targets.count(aten.addmm.default) == 2
    assert aten.relu.default in targets
    assert all(isinstance(t, torch._ops.OpOverload) for t in targets)
    assert placeholder_names(traced) == ["x"]
    torch.testing.assert_close(traced(x), model(x))
    other = torch.randn(3, 4)
    torch.testing.assert_close(traced(other), model(other))


def test_parameters_stay_get_attr_sharing_the_original_tensors() -> None:
    model = MLP()
    traced = trace_inference(torch.fx.symbolic_trace(model), [torch.randn(2, 4)])

    get_attrs = [n for n in traced.graph.nodes if n.op == "get_attr"]
    assert sorted(n.target for n in get_attrs) == [
        "fc1.bias",
        "fc1.weight",
        "fc2.bias",
        "fc2.weight",
    ]
    assert traced.get_parameter("fc1.weight") is model.fc1.weight
    for node in get_attrs:
        assert isinstance(node.meta["val"], FakeTensor)
        assert node.meta["val"].shape == traced.get_parameter(node.target).shape
    with torch.no_grad():
        model.fc2.bias.add_(10.0)
    x = torch.randn(2, 4)
    torch.testing.assert_close(traced(x), model(x))


def test_module_stack_meta_survives_for_call_module_nodes() -> None:
    traced = trace_inference(torch.fx.symbolic_trace(MLP()), [torch.randn(2, 4)])
    addmms = [n for n in traced.graph.nodes if n.target is aten.addmm.default]
    assert [list(n.meta["nn_module_stack"]) for n in addmms] == [["fc1"], ["fc2"]]


def test_reduction_where_and_comparisons() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (x > 0) & (y <= x)
        return torch.where(mask, x, y * 2).sum(-1), (x == y).float().mean()

    gm = torch.fx.symbolic_trace(f)
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    y[0, 0] = x[0, 0]

    traced = trace_inference(gm, [x, y])

    verify(traced)
    targets = call_targets(traced)
    for op in (aten.gt.Scalar, aten.le.Tensor, aten.where.self, aten.sum.dim_IntList):
        assert op in targets
    out = traced(x, y)
    assert isinstance(out, tuple) and len(out) == 2
    for got, want in zip(out, f(x, y)):
        torch.testing.assert_close(got, want)
    sum_node = next(n for n in traced.graph.nodes if n.target is aten.sum.dim_IntList)
    assert sum_node.meta["val"].shape == (4,)


def test_output_structure_is_kept_for_a_single_tensor_output() -> None:
    gm = torch.fx.symbolic_trace(lambda x: x.exp())
    traced = trace_inference(gm, [torch.randn(3)])
    x = torch.randn(3)
    out = traced(x)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, x.exp())


def test_get_attr_parameter_buffer_and_constant() -> None:
    class WithAttrs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.randn(5))
            self.register_buffer("shift", torch.randn(5))
            self.table = torch.arange(5.0)  # a plain tensor attribute

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.scale + self.shift - self.table

    model = WithAttrs()
    gm = torch.fx.symbolic_trace(model)
    assert {n.target for n in gm.graph.nodes if n.op == "get_attr"} == {"scale", "shift", "table"}
    x = torch.randn(2, 5)

    traced = trace_inference(gm, [x])

    verify(traced)
    assert placeholder_names(traced) == ["x"]
    assert {n.target for n in traced.graph.nodes if n.op == "get_attr"} == {
        "scale",
        "shift",
        "table",
    }
    assert isinstance(traced.scale, torch.nn.Parameter)
    torch.testing.assert_close(traced(x), model(x))


def test_tied_weights_are_lifted_once() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(3, 3, bias=False)
            self.b = torch.nn.Linear(3, 3, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    model = Tied()
    x = torch.randn(2, 3)
    traced = trace_inference(torch.fx.symbolic_trace(model), [x])
    get_attrs = [n for n in traced.graph.nodes if n.op == "get_attr"]
    assert len(get_attrs) == 1
    torch.testing.assert_close(traced(x), model(x))


def test_input_mutation_is_written_back_into_the_real_input() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        x.add_(1)
        return (x * y,)

    gm = torch.fx.symbolic_trace(f)
    traced = trace_inference(gm, [torch.randn(3), torch.randn(3)])

    verify(traced)
    copies = [n for n in traced.graph.nodes if n.target is aten.copy_.default]
    assert len(copies) == 1
    assert copies[0].args[0].op == "placeholder" and copies[0].args[0].name == "x"
    assert aten.add_.Tensor not in call_targets(traced)
    x, y = torch.randn(3), torch.randn(3)
    x_eager, expected_x = x.clone(), x + 1
    (out,) = traced(x, y)
    torch.testing.assert_close(x, expected_x)
    torch.testing.assert_close(out, f(x_eager, y)[0])


def test_buffer_mutation_through_get_attr_updates_the_buffer() -> None:
    root = torch.nn.Module()
    root.register_buffer("count", torch.zeros(2))
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    count = graph.get_attr("count")
    graph.call_method("add_", (count, 1.0))
    graph.output((graph.call_function(torch.add, (x, count)),))
    gm = torch.fx.GraphModule(root, graph)

    traced = trace_inference(gm, [torch.zeros(2)])

    verify(traced)
    assert traced.get_buffer("count") is root.count
    writeback = next(n for n in traced.graph.nodes if n.target is aten.copy_.default)
    assert writeback.args[0].op == "get_attr"
    (first,) = traced(torch.zeros(2))
    (second,) = traced(torch.zeros(2))
    torch.testing.assert_close(root.count, torch.full((2,), 2.0))
    torch.testing.assert_close(first, torch.ones(2))
    torch.testing.assert_close(second, torch.full((2,), 2.0))


def test_batch_norm_training_updates_running_stats_functionally() -> None:
    bn = torch.nn.BatchNorm1d(3)
    model = torch.nn.Sequential(bn)  # BatchNorm1d is a call_module leaf of symbolic_trace
    reference = torch.nn.BatchNorm1d(3)
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(8, 3)

    traced = trace_inference(gm, [x])

    verify(traced)
    targets = call_targets(traced)
    assert aten._native_batch_norm_legit_functional.default in targets
    assert aten.native_batch_norm.default not in targets
    written = {n.args[0].target for n in traced.graph.nodes if n.target is aten.copy_.default}
    assert written == {"0.running_mean", "0.running_var", "0.num_batches_tracked"}
    torch.testing.assert_close(traced(x), reference(x))
    torch.testing.assert_close(bn.running_mean, reference.running_mean)
    torch.testing.assert_close(bn.running_var, reference.running_var)
    assert int(bn.num_batches_tracked) == 1


def test_composite_kernels_that_escape_functionalization_are_functionalized() -> None:
    # aten._pad_circular's kernel copies into slices of an empty tensor; traced whole it
    # leaves copy_ nodes, which a second functionalization turns into slice_scatter.
    def fn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(x, (1, 2), mode="circular")
        weight.mul_(2)  # an input mutation next to it still comes out as a write-back
        return padded * weight

    gm = torch.fx.symbolic_trace(fn)
    x, weight = torch.randn(2, 3, 5), torch.randn(8)
    expected_weight = weight.clone()
    expected = fn(x, expected_weight)

    traced = trace_inference(gm, [x, weight])

    verify(traced)  # no op writes into its arguments but the write-backs
    targets = call_targets(traced)
    assert aten.slice_scatter.default in targets
    assert [n.args[0].name for n in traced.graph.nodes if n.target is aten.copy_.default] == [
        "weight"
    ]
    torch.testing.assert_close(traced(x, weight), expected)
    torch.testing.assert_close(weight, expected_weight)


def test_second_functionalization_under_symbolic_sizes() -> None:
    # rms_norm's composite kernel adds eps in place (a second functionalization), then lerp of a
    # 0-d value broadcasts under symbolic sizes: its meta function's expand needs the python
    # dispatcher (fuzzer seed 26000700: "SymIntArrayRef expected to contain only concrete integers").
    def fn(x: torch.Tensor) -> torch.Tensor:
        normed = torch.nn.functional.rms_norm(x, x.shape[-1:])
        return torch.lerp(x.abs().amax(), normed, 0.3)

    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    traced = trace_inference(torch.fx.symbolic_trace(fn), [fake_mode.from_tensor(torch.randn(3, 4))])

    verify(traced)
    assert aten.add_.Scalar not in call_targets(traced)
    for shape in [(3, 4), (2, 5)]:
        x = torch.randn(shape)
        torch.testing.assert_close(traced(x), fn(x))


def test_multi_output_ops_and_data_dependent_sizes() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        parts = torch.split(x, 1)
        return x.nonzero(), torch.max(x, dim=1)[1], parts[1]

    x = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    traced = trace_inference(torch.fx.symbolic_trace(f), [x])

    verify(traced)
    getitems = [n for n in traced.graph.nodes if n.target is operator.getitem]
    assert getitems and all(isinstance(n.meta["val"], FakeTensor) for n in getitems)
    nonzero = next(n for n in traced.graph.nodes if n.target is aten.nonzero.default)
    assert isinstance(nonzero.meta["val"].shape[0], torch.SymInt)
    for got, want in zip(traced(x), f(x)):
        torch.testing.assert_close(got, want)


def test_tensor_constants_created_in_the_graph() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x + torch.ones(3) * 2

    traced = trace_inference(torch.fx.symbolic_trace(f), [torch.randn(3)])
    verify(traced)
    x = torch.randn(3)
    torch.testing.assert_close(traced(x), f(x))


def test_fake_inputs_are_enough_and_no_data_is_read() -> None:
    fake_mode = FakeTensorMode()
    fake_x = fake_mode.from_tensor(torch.randn(2, 3))

    traced = trace_inference(torch.fx.symbolic_trace(lambda x: (x.sin() * 2,)), [fake_x])

    verify(traced)
    val = traced.graph.find_nodes(op="placeholder")[0].meta["val"]
    assert val.fake_mode is fake_mode and val.shape == (2, 3)
    x = torch.randn(2, 3)
    torch.testing.assert_close(traced(x)[0], x.sin() * 2)


def test_symbolic_fake_inputs_give_symbolic_sizes() -> None:
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    fake_x = fake_mode.from_tensor(torch.randn(3, 4))  # shape_env: dynamic sizes

    def f(x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x.reshape(-1).cos(), x.shape[0] + 1

    traced = trace_inference(torch.fx.symbolic_trace(f), [fake_x])

    verify(traced)
    cos = next(n for n in traced.graph.nodes if n.target is aten.cos.default)
    assert isinstance(cos.meta["val"].shape[0], torch.SymInt)
    for shape in [(3, 4), (5, 2)]:
        x = torch.randn(shape)
        out, size = traced(x)
        torch.testing.assert_close(out, x.reshape(-1).cos())
        assert size == shape[0] + 1


def test_real_inputs_standalone_give_static_sizes() -> None:
    traced = trace_inference(torch.fx.symbolic_trace(lambda x: x.reshape(-1)), [torch.randn(3, 4)])
    for node in traced.graph.nodes:
        if isinstance(node.meta.get("val"), torch.Tensor):
            assert all(isinstance(s, int) for s in node.meta["val"].shape), node.name


def test_plain_int_input_keeps_its_placeholder() -> None:
    def f(x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n

    traced = trace_inference(torch.fx.symbolic_trace(f), [torch.randn(3), 3])
    verify(traced)
    assert placeholder_names(traced) == ["x", "n"]
    assert traced.graph.find_nodes(op="placeholder")[1].meta["val"] == 3
    x = torch.randn(3)
    torch.testing.assert_close(traced(x, 3), x * 3)


def test_decompositions_remove_silu() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x)

    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4)
    plain = trace_inference(gm, [x])
    assert aten.silu.default in call_targets(plain)

    decomposed = trace_inference(gm, [x], decompositions=torch._decomp.core_aten_decompositions())

    verify(decomposed)
    targets = call_targets(decomposed)
    assert aten.silu.default not in targets
    assert aten.sigmoid.default in targets and aten.mul.Tensor in targets
    torch.testing.assert_close(decomposed(x), f(x))


def test_custom_decomposition_mapping_is_used() -> None:
    calls = []

    def relu_as_clamp(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape)
        return aten.clamp_min.default(x, 0.0)

    gm = torch.fx.symbolic_trace(lambda x: torch.relu(x))
    traced = trace_inference(
        gm, [torch.randn(4)], decompositions={aten.relu.default: relu_as_clamp}
    )
    assert calls == [(4,)]
    assert call_targets(traced) == [aten.clamp_min.default]
    x = torch.randn(4)
    torch.testing.assert_close(traced(x), torch.relu(x))


def test_trace_error_names_node_op_and_user_source() -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no kernel for this")

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.sin, (x,))
    bad = graph.call_function(broken, (y,))
    bad.meta["stack_trace"] = (
        '  File "model.py", line 12, in forward\n    return broken(torch.sin(x))\n'
    )
    graph.output((bad,))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)

    with pytest.raises(TraceError) as info:
        trace_inference(gm, [torch.randn(2)])

    message = str(info.value)
    assert "'broken'" in message and "broken" in message
    assert 'File "model.py", line 12, in forward' in message
    assert "return broken(torch.sin(x))" in message
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "no kernel for this" in message


def test_wrong_number_of_inputs_is_a_clear_error() -> None:
    gm = torch.fx.symbolic_trace(lambda x, y: x + y)
    with pytest.raises(TraceError, match="2 inputs .*1 example"):
        trace_inference(gm, [torch.randn(2)])


def test_unsupported_input_type_names_the_placeholder() -> None:
    gm = torch.fx.symbolic_trace(lambda x, y: x)
    with pytest.raises(TraceError, match="input 'y' is a str"):
        trace_inference(gm, [torch.randn(2), "nope"])


def test_input_graph_is_not_modified() -> None:
    model = MLP()
    gm = torch.fx.symbolic_trace(model)
    code_before = gm.code
    nodes_before = [(n.name, n.op, n.target) for n in gm.graph.nodes]
    trace_inference(gm, [torch.randn(2, 4)])
    assert gm.code == code_before
    assert [(n.name, n.op, n.target) for n in gm.graph.nodes] == nodes_before


def test_lifted_name_clashing_with_a_traced_constant_is_renamed() -> None:
    root = torch.nn.Module()
    root.register_buffer("_tensor_constant0", torch.full((2,), 5.0))
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    buffer = graph.get_attr("_tensor_constant0")
    fresh = graph.call_function(torch.tensor, ([1.0, 2.0],))  # make_fx names it _tensor_constant0
    graph.output(
        (graph.call_function(torch.add, (graph.call_function(torch.mul, (x, buffer)), fresh)),)
    )
    gm = torch.fx.GraphModule(root, graph)

    traced = trace_inference(gm, [torch.ones(2)])

    verify(traced)
    targets = sorted(n.target for n in traced.graph.nodes if n.op == "get_attr")
    assert len(targets) == 2 and len(set(targets)) == 2
    (out,) = traced(torch.ones(2))
    torch.testing.assert_close(out, torch.tensor([6.0, 7.0]))


def test_a_mutated_input_that_is_returned_is_returned_itself() -> None:
    class AddInPlace(torch.nn.Module):
        def forward(self, x, y):
            x.add_(1)
            return x, y + 1

    gm = torch.fx.symbolic_trace(AddInPlace())
    traced = trace_inference(gm, [torch.randn(3), torch.randn(3)])
    (outputs,) = [n.args[0] for n in traced.graph.nodes if n.op == "output"]
    assert outputs[0].target is torch.ops.aten.copy_.default  # the write-back returns x itself
    x, y = torch.randn(3), torch.randn(3)
    expected = x + 1
    got = traced(x, y)
    assert got[0] is x and torch.equal(x, expected)
