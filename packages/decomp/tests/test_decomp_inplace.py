"""In-place ops whose mutation is unobservable become out-of-place; the others stay."""

import operator

import torch
import torch.fx as fx
from torch.func import functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.decomp import LOOP_LEVEL_OPS, DecompTable, check_opset, decompose, loop_level, opset
from kiln.decomp._internal.inplace import functional_variant, unobservable_inplace_nodes

aten = torch.ops.aten


def _graph(build, *vals):
    """A graph whose placeholders carry ``vals`` as meta["val"]; build(graph, *nodes)."""
    graph = fx.Graph()
    nodes = []
    for i, val in enumerate(vals):
        node = graph.placeholder(f"x{i}")
        node.meta["val"] = val
        nodes.append(node)
    graph.output(build(graph, *nodes))
    return fx.GraphModule(torch.nn.Module(), graph)


def _call(graph, op, *args, val):
    node = graph.call_function(op, args)
    node.meta["val"] = val
    return node


def test_functional_variant():
    assert functional_variant(aten.mul_.Tensor) is aten.mul.Tensor
    assert functional_variant(aten.squeeze_.dim) is aten.squeeze.dim
    assert functional_variant(aten.mul.Tensor) is None
    assert functional_variant(aten.index_put_.default) is aten.index_put.default
    assert functional_variant(aten.copy_.default) is aten.copy.default


def test_matmul_squeeze_becomes_functional():
    gm = make_fx(functionalize(torch.matmul), tracing_mode="fake")(
        torch.randn(3), torch.randn(3, 4)
    )
    assert aten.squeeze_.dim in opset(gm)  # functorch's functionalize leaves it
    out = decompose(gm, DecompTable())
    assert aten.squeeze_.dim not in opset(out) and aten.squeeze.dim in opset(out)
    a, b = torch.randn(3), torch.randn(3, 4)
    torch.testing.assert_close(out(a, b), a @ b)


def test_mutation_of_a_fresh_single_use_value_is_rewritten():
    def build(g, x):
        fresh = _call(g, aten.exp.default, x, val=torch.empty(4))
        return _call(g, aten.mul_.Tensor, fresh, x, val=torch.empty(4))

    x = torch.randn(4)
    gm = _graph(build, torch.empty(4))
    assert len(unobservable_inplace_nodes(gm.graph)) == 1
    out = decompose(gm, loop_level())
    check_opset(out, LOOP_LEVEL_OPS)
    torch.testing.assert_close(out(x), x.exp() * x)


def test_observable_mutations_stay():
    def of_input(g, x):  # mutates a graph input
        return g.call_function(aten.mul_.Tensor, (x, x))

    def read_again(g, x):  # the mutated value is read by another node afterwards
        fresh = _call(g, aten.exp.default, x, val=torch.empty(4))
        mutated = _call(g, aten.mul_.Tensor, fresh, x, val=torch.empty(4))
        return g.call_function(aten.add.Tensor, (mutated, fresh))

    def of_a_view(g, x):  # mutating a view writes through to its base
        view = _call(g, aten.view.default, x, [4], val=torch.empty(4))
        return g.call_function(aten.add_.Scalar, (view, 1.0))

    def promoting(g, x):  # int tensor * float scalar: out-of-place would be float
        fresh = _call(g, aten.abs.default, x, val=torch.empty(4, dtype=torch.int64))
        return g.call_function(aten.mul_.Scalar, (fresh, 1.5))

    for build, val in [
        (of_input, torch.empty(4)),
        (read_again, torch.empty(4)),
        (of_a_view, torch.empty(2, 2)),
        (promoting, torch.empty(4, dtype=torch.int64)),
    ]:
        gm = _graph(build, val)
        assert not unobservable_inplace_nodes(gm.graph), build.__name__


def test_mutation_seen_through_a_view_keeps_eager_semantics():
    def fn(x):
        y = x.exp()
        view = y.view(-1)
        y.mul_(2)
        return view + 1  # the view sees the mutation: 2 * exp(x) + 1

    x = torch.randn(5)
    gm = make_fx(fn, tracing_mode="fake")(x)
    out = decompose(gm, DecompTable())
    assert aten.mul_.Tensor in opset(out)
    torch.testing.assert_close(out(x), fn(x))


def test_later_reads_of_the_mutated_tensor_go_through_the_inplace_node():
    def fn(x):
        y = x.exp()
        z = y.mul_(2)
        return z + y  # make_fx records both reads as the mul_ node: 4 * exp(x)

    x = torch.randn(5)
    out = decompose(make_fx(fn, tracing_mode="fake")(x), DecompTable())
    assert aten.mul_.Tensor not in opset(out)
    torch.testing.assert_close(out(x), fn(x))


def test_getitem_of_a_fresh_multi_output_is_fresh():
    def build(g, x):
        pair = _call(g, aten.var_mean.correction, x, val=(torch.empty(()), torch.empty(())))
        var = _call(g, operator.getitem, pair, 0, val=torch.empty(()))
        return _call(g, aten.sqrt_.default, var, val=torch.empty(()))

    gm = _graph(build, torch.empty(3, 4))
    assert list(unobservable_inplace_nodes(gm.graph).values()) == [aten.sqrt.default]


def test_functional_variant_matches_arguments_not_just_the_overload_name():
    # pow_.Scalar(Tensor self, Scalar exponent) is pow.Tensor_Scalar; pow.Scalar takes a Scalar base
    assert functional_variant(aten.pow_.Scalar) is aten.pow.Tensor_Scalar


def test_inplace_ops_of_a_backward_graph():
    def fn(x, g):  # the backward of |x| ** -0.5 * sign: pow_ and masked_fill_ on temporaries
        y = x.abs().pow_(-0.5)
        return y.masked_fill_(x == 0, 0) * g

    x, g = torch.randn(6), torch.randn(6)
    x[2] = 0.0
    gm = make_fx(fn, tracing_mode="fake")(x, g)
    out = decompose(gm, loop_level())
    check_opset(out, LOOP_LEVEL_OPS)
    torch.testing.assert_close(out(x, g), fn(x, g))
