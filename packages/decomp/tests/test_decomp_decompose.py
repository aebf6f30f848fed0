"""decompose(): numerics against eager, the loop-level opset, symbolic shapes, metadata."""

import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.decomp import (
    LOOP_LEVEL_OPS,
    DecompTable,
    check_opset,
    core_aten,
    decompose,
    loop_level,
    opset,
    register,
    verify,
)

aten = torch.ops.aten


CASES = {
    "softmax": (lambda x: torch.softmax(x, -1), aten._softmax.default),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), aten._log_softmax.default),
    "gelu": (lambda x: F.gelu(x), aten.gelu.default),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), aten.gelu.default),
    "silu": (lambda x: F.silu(x), aten.silu.default),
    "layer_norm": (lambda x: F.layer_norm(x, (x.shape[-1],)), aten.native_layer_norm.default),
    "hardswish": (lambda x: F.hardswish(x), aten.hardswish.default),
}


def _trace(fn, *inputs, mode="fake"):
    return make_fx(fn, tracing_mode=mode, record_stack_traces=True, _allow_non_fake_inputs=True)(
        *inputs
    )


def _compute_ops(gm):
    """OpOverloads of gm, without the sym_size queries symbolic tracing adds."""
    return {op for op in opset(gm) if isinstance(op, torch._ops.OpOverload)} - {aten.sym_size.int}


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_loop_level_numerics_and_opset(name, mode):
    fn, original_op = CASES[name]
    x = torch.randn(5, 16) * 3
    gm = _trace(fn, x, mode=mode)
    assert original_op in opset(gm)
    out = decompose(gm, loop_level())
    assert original_op not in opset(out)
    check_opset(out, LOOP_LEVEL_OPS)
    verify(out)
    torch.testing.assert_close(out(x), fn(x), rtol=1e-5, atol=1e-5)
    if mode == "symbolic":  # the same graph serves another shape
        y = torch.randn(3, 7)
        torch.testing.assert_close(out(y), fn(y), rtol=1e-5, atol=1e-5)


def test_gelu_modes_decompose_differently():
    x = torch.randn(64)
    exact = decompose(_trace(lambda t: F.gelu(t), x), loop_level())
    approx = decompose(_trace(lambda t: F.gelu(t, approximate="tanh"), x), loop_level())
    assert aten.erf.default in opset(exact) and aten.tanh.default not in opset(exact)
    assert aten.tanh.default in opset(approx) and aten.erf.default not in opset(approx)
    # the two approximations differ, and each decomposition matches its own mode
    assert not torch.allclose(exact(x), approx(x), rtol=0, atol=1e-7)


def test_symbolic_sizes_survive():
    def fn(x, weight):  # var over the symbolic dim divides by a symbolic count
        return F.layer_norm(x, (8,), weight).softmax(-1) + torch.var(x, 0, keepdim=True)

    weight = torch.linspace(0.5, 1.5, 8)
    gm = _trace(fn, torch.randn(4, 8), weight, mode="symbolic")
    out = decompose(gm, loop_level())
    val = next(n for n in out.graph.nodes if n.op == "placeholder").meta["val"]
    assert isinstance(val.shape[0], torch.SymInt)  # dim 1 is specialised by layer_norm
    output_val = out.graph.output_node().args[0].meta["val"]
    assert str(output_val.shape[0]) == str(val.shape[0])
    assert aten.sym_size.int in opset(out) and aten.var.correction not in opset(out)
    check_opset(out, LOOP_LEVEL_OPS)
    for rows in (2, 6):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(out(x, weight), fn(x, weight), rtol=1e-5, atol=1e-5)


def test_symint_placeholder():
    fn = lambda x, n: torch.softmax(F.gelu(x.view(n, -1)), -1)  # noqa: E731
    gm = _trace(fn, torch.randn(4, 8), 2, mode="symbolic")
    out = decompose(gm, loop_level())
    vals = [n.meta["val"] for n in out.graph.nodes if n.op == "placeholder"]
    assert isinstance(vals[1], torch.SymInt)
    x = torch.randn(6, 8)
    torch.testing.assert_close(out(x, 3), fn(x, 3))


class _SoftmaxPlusGelu(torch.nn.Module):
    def forward(self, x):
        a = torch.softmax(x, -1)
        b = F.gelu(x)
        return a + b, x.sum()


def test_every_node_has_val_and_stack_trace_is_carried():
    # make_fx records stack traces of forward() frames only, hence the module
    gm = _trace(_SoftmaxPlusGelu(), torch.randn(3, 4))
    assert "torch.softmax(x, -1)" in next(
        n.meta["stack_trace"] for n in gm.graph.nodes if n.target is aten._softmax.default
    )
    out = decompose(gm, loop_level())
    for node in out.graph.nodes:
        if node.op in ("placeholder", "call_function", "get_attr"):
            assert "val" in node.meta, node.name
    traces = {}
    for node in out.graph.nodes:
        traces.setdefault(node.target, []).append(node.meta.get("stack_trace", ""))
    assert all("torch.softmax(x, -1)" in t for t in traces[aten.amax.default])
    assert all("torch.softmax(x, -1)" in t for t in traces[aten.exp.default])
    assert all("F.gelu(x)" in t for t in traces[aten.erf.default])
    assert all("x.sum()" in t for t in traces[aten.sum.default])
    # gelu's decomposition (1 + erf) and the user's a + b each add, with their own lines
    assert traces[aten.add.Scalar] and all("F.gelu(x)" in t for t in traces[aten.add.Scalar])
    assert len(traces[aten.add.Tensor]) == 1 and "a + b" in traces[aten.add.Tensor][0]


def test_calling_convention_is_kept():
    def fn(x, y):
        return F.silu(x) * y, y.sum(), x

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    gm = _trace(fn, x, y)
    out = decompose(gm, loop_level())
    assert [n.name for n in out.graph.nodes if n.op == "placeholder"] == [
        n.name for n in gm.graph.nodes if n.op == "placeholder"
    ]
    result = out(x, y)
    assert isinstance(result, tuple) and len(result) == 3
    for got, want in zip(result, fn(x, y)):
        torch.testing.assert_close(got, want)


def test_original_graph_is_not_modified():
    gm = _trace(lambda x: F.gelu(x), torch.randn(4))
    before = gm.code
    decompose(gm, loop_level())
    assert gm.code == before and aten.gelu.default in opset(gm)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, x):
        return F.gelu(self.norm(self.lin(x))) * self.scale


def test_get_attr_parameters_keep_names_and_values():
    torch.manual_seed(0)
    block = _Block()
    x = torch.randn(4, 8)
    gm = torch.export.export(block, (x,)).module()
    out = decompose(gm, loop_level())
    targets = {n.target for n in out.graph.nodes if n.op == "get_attr"}
    assert {"lin.weight", "lin.bias", "norm.weight", "norm.bias", "scale"} <= targets
    assert out.get_parameter("lin.weight") is block.lin.weight  # shared, not copied
    for node in out.graph.nodes:
        if node.op == "get_attr":
            assert isinstance(node.meta["val"], torch._subclasses.FakeTensor)
    check_opset(out, LOOP_LEVEL_OPS)
    torch.testing.assert_close(out(x), block(x))
    with torch.no_grad():
        block.lin.weight.mul_(2)  # the decomposed module sees the same parameters
    torch.testing.assert_close(out(x), block(x))


def test_constant_names_do_not_collide():
    # make_fx names tensor constants _tensor_constant0, ... in the original graph and in
    # the retrace alike; a constant a decomposition creates must not replace the original.
    def relu_times_constant(x):
        return aten.mul.Tensor(x, torch.tensor([2.0, 3.0, 4.0]))

    def fn(x):
        return x + torch.tensor([1.0, 2.0, 3.0]), torch.relu(x)

    x = torch.randn(3)
    gm = _trace(fn, x)
    table = register(loop_level(), aten.relu.default, relu_times_constant)
    out = decompose(gm, table)
    assert len([n for n in out.graph.nodes if n.op == "get_attr"]) == 2
    torch.testing.assert_close(out(x), (fn(x)[0], relu_times_constant(x)))


def test_example_inputs_when_graph_has_no_meta():
    gm = fx.symbolic_trace(lambda x: torch.ops.aten.gelu.default(x))
    x = torch.randn(6)
    with pytest.raises(ValueError, match="example_inputs"):
        decompose(gm, loop_level())
    out = decompose(gm, loop_level(), [x])
    assert aten.erf.default in opset(out)
    verify(out)
    torch.testing.assert_close(out(x), F.gelu(x))


def test_table_choice_matters():
    fn = lambda x: F.gelu(x) + torch.softmax(x, -1)  # noqa: E731
    x = torch.randn(2, 5)
    gm = _trace(fn, x)
    only_gelu = decompose(gm, loop_level().only([aten.gelu.default]))
    assert aten.gelu.default not in opset(only_gelu)
    assert aten._softmax.default in opset(only_gelu)
    kept = decompose(gm, loop_level().keep([aten.gelu.default]))
    assert aten.gelu.default in opset(kept) and aten._softmax.default not in opset(kept)
    assert aten._softmax.default in opset(decompose(gm, core_aten()))  # Core ATen keeps it
    for out in (only_gelu, kept):
        torch.testing.assert_close(out(x), fn(x))


def test_user_registered_decomposition_is_applied():
    def relu_as_maximum(x):
        return aten.maximum.default(x, aten.scalar_tensor.default(0.0, dtype=x.dtype))

    table = register(DecompTable(), aten.relu.default)(relu_as_maximum)
    x = torch.randn(10)
    out = decompose(_trace(torch.relu, x), table)
    assert set(_compute_ops(out)) == {aten.maximum.default, aten.scalar_tensor.default}
    torch.testing.assert_close(out(x), torch.relu(x))


def test_dead_nodes_left_by_decompositions_are_removed_but_random_ops_stay():
    def fn(x):
        torch.rand(3)  # unused, but it advances the generator: must stay
        return F.batch_norm(x, torch.zeros(4), torch.ones(4))

    gm = _trace(fn, torch.randn(2, 4, 3))
    out = decompose(gm, loop_level())
    ops = opset(out)
    assert aten.empty.memory_format not in ops  # batch norm's unused reserve buffer
    assert aten.rand.default in ops
    assert all(
        n.users or n.op == "output" or n.target is aten.rand.default
        for n in out.graph.nodes
        if n.op != "placeholder"
    )


def test_dynamo_graph_with_symbolic_inputs():
    graphs = []

    def backend(gm, example_inputs):
        out = decompose(gm, loop_level(), example_inputs)
        graphs.append(out)
        return out

    def fn(x, w):
        return torch.softmax(F.gelu(x @ w), -1)

    compiled = torch.compile(fn, backend=backend, dynamic=True, fullgraph=True)
    w = torch.randn(8, 3)
    for rows in (4, 7):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(compiled(x, w), fn(x, w))
    assert len(graphs) == 1
    check_opset(graphs[0], LOOP_LEVEL_OPS)
    verify(graphs[0])
    assert operator.getitem not in opset(graphs[0])


class _Branchy(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: F.gelu(t), lambda t: t.softmax(-1), (x,))


def test_bodies_of_higher_order_ops_are_decomposed():
    x = torch.randn(3, 4)
    gm = torch.export.export(_Branchy(), (x,)).module()
    out = decompose(gm, loop_level())
    assert "higher_order.cond" in opset(out)
    for name in ("true_graph_0", "false_graph_0"):
        body = getattr(out, name)
        check_opset(body, LOOP_LEVEL_OPS)
        assert aten.gelu.default not in opset(body) and aten._softmax.default not in opset(body)
    for sample in (x.abs(), -x.abs()):
        torch.testing.assert_close(out(sample), _Branchy()(sample))


def test_an_unused_collective_is_kept():
    def fn(x):
        torch.ops._c10d_functional.all_reduce(x, "sum", "0")  # every rank issues it, used or not
        return torch.nn.functional.gelu(x)

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(4))
    out = decompose(gm, loop_level())
    assert torch.ops._c10d_functional.all_reduce.default in opset(out)


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_a_decomposed_value_keeps_the_layout_of_the_op_it_replaced(mode):
    """38000308: kiln's group_norm decomposition ends in a view of a contiguous value, eager's
    (CPU) group_norm of a channels-last input is channels-last; torch's lerp decomposition then
    ended in a copy_strided to the strides of its operands as the retrace laid them out:
    contiguous. Each decomposed value is put back into its node's recorded (eager) layout."""

    def fn(x):
        return torch.lerp(F.group_norm(x, 1), x, 0.3)

    x = torch.randn(5, 3, 2, 2).to(memory_format=torch.channels_last)
    gm = _trace(fn, x, mode=mode)
    out = decompose(gm, loop_level())
    assert torch.ops.prims.copy_strided.default not in opset(out)
    (result,) = [n for n in out.graph.nodes if n.op == "output"][0].args
    value = (result[0] if isinstance(result, (tuple, list)) else result).meta["val"]
    recorded = gm.graph.output_node().args[0].meta["val"]
    assert _hinted(value.stride()) == _hinted(recorded.stride()) == list(x.stride())
    torch.testing.assert_close(out(x), fn(x))
    assert out(x).stride() == fn(x).stride()


def _hinted(values):
    """Sizes or strides as the ints they are for the example inputs."""
    return [v.node.hint if isinstance(v, torch.SymInt) else v for v in values]
