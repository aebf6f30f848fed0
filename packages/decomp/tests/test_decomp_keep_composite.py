"""keep(...) preserves CompositeImplicitAutograd ops whole (linear, layer_norm, upsample...),
whichever way they reach decompose: in the input graph, from Torch IR, or emitted by a
decomposition of the table."""

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
from kiln.decomp._internal.dispatch_mode import is_composite_implicit

aten = torch.ops.aten
COMPOSITES = [aten.linear, aten.layer_norm, aten.upsample_nearest2d]


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x, img):
        return self.norm(self.lin(x)).relu(), F.interpolate(img, scale_factor=2, mode="nearest")


def _exported():
    torch.manual_seed(0)
    net = _Net()
    inputs = (torch.randn(4, 8), torch.randn(1, 2, 3, 3))
    return net, inputs, torch.export.export(net, inputs).module()


def test_the_ops_are_composite_implicit():
    for packet in COMPOSITES:
        assert any(is_composite_implicit(getattr(packet, o)) for o in packet.overloads())
    assert not is_composite_implicit(aten.addmm.default)


def test_kept_composites_of_an_exported_graph_stay_whole():
    net, inputs, gm = _exported()
    composite = {aten.linear.default, aten.layer_norm.default, aten.upsample_nearest2d.vec}
    assert composite <= set(opset(gm))  # torch.export keeps them in its training IR
    kept = decompose(gm, loop_level().keep(COMPOSITES))
    assert composite <= set(opset(kept))
    verify(kept)
    check_opset(kept, LOOP_LEVEL_OPS | composite)
    for got, want in zip(kept(*inputs), net(*inputs)):
        torch.testing.assert_close(got, want)
    # the kept nodes carry fake values of the right shape
    node = next(n for n in kept.graph.nodes if n.target is aten.upsample_nearest2d.vec)
    assert list(node.meta["val"].shape) == [1, 2, 6, 6]


def test_without_keep_the_composites_are_decomposed():
    net, inputs, gm = _exported()
    out = decompose(gm, loop_level())
    ops = set(opset(out))
    assert not ops & {aten.linear.default, aten.layer_norm.default, aten.upsample_nearest2d.vec}
    assert aten.addmm.default in ops
    for got, want in zip(out(*inputs), net(*inputs)):
        torch.testing.assert_close(got, want)


def test_keep_only_some_and_core_aten():
    net, inputs, gm = _exported()
    out = decompose(gm, core_aten().keep([aten.linear]))
    ops = set(opset(out))
    assert aten.linear.default in ops and aten.layer_norm.default not in ops
    assert aten.native_layer_norm.default in ops  # Core ATen keeps the native op
    for got, want in zip(out(*inputs), net(*inputs)):
        torch.testing.assert_close(got, want)


def test_kept_composite_in_a_hand_built_graph_with_symbolic_shapes():
    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    graph.output(graph.call_function(aten.linear.default, (x, w)))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    sym = make_fx(lambda a, b: aten.mm.default(a, b.t()), tracing_mode="symbolic")(
        torch.randn(5, 3), torch.randn(4, 3)
    )
    # reuse the symbolic fake values of an equivalent traced graph as placeholder meta
    for mine, theirs in zip(graph.nodes, sym.graph.nodes):
        if mine.op == "placeholder":
            mine.meta["val"] = theirs.meta["val"]
    out = decompose(gm, loop_level().keep([aten.linear.default]))
    assert set(opset(out)) == {aten.linear.default}
    assert isinstance(out.graph.output_node().args[0].meta["val"].shape[0], torch.SymInt)
    a, b = torch.randn(7, 3), torch.randn(2, 3)
    torch.testing.assert_close(out(a, b), F.linear(a, b))


def test_kept_composite_emitted_by_a_decomposition():
    def relu_through_linear(x):  # silly on purpose: emits a composite op
        eye = aten.eye.default(x.shape[-1], dtype=x.dtype)
        return aten.relu.default(aten.linear.default(x, eye))

    table = register(DecompTable().keep([aten.linear]), aten.gelu.default, relu_through_linear)
    x = torch.randn(3, 4)
    gm = make_fx(lambda t: F.gelu(t))(x)
    out = decompose(gm, table)
    assert aten.linear.default in opset(out) and aten.gelu.default not in opset(out)
    torch.testing.assert_close(out(x), torch.relu(x))
    plain = decompose(gm, register(DecompTable(), aten.gelu.default, relu_through_linear))
    assert aten.linear.default not in opset(plain)


def test_kept_composite_from_a_dynamo_graph():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(decompose(gm, loop_level().keep([aten.linear]), example_inputs))
        return graphs[-1]

    def fn(x, w):
        return F.linear(x, w).softmax(-1)

    x, w = torch.randn(4, 6), torch.randn(3, 6)
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), fn(x, w))
    ops = set(opset(graphs[0]))
    assert aten.linear.default in ops and aten._softmax.default not in ops


def test_kept_matmul_from_torch_ir_is_not_split_into_views_and_bmm():
    gm = fx.symbolic_trace(lambda a, b: torch.matmul(a, b))
    a, b = torch.randn(2, 3, 4), torch.randn(4, 5)
    kept = decompose(gm, DecompTable().keep([aten.matmul]), [a, b])
    assert set(opset(kept)) == {aten.matmul.default}
    split = decompose(gm, DecompTable(), [a, b])
    assert aten.matmul.default not in opset(split) and aten.mm.default in opset(split)
    for out in (kept, split):
        torch.testing.assert_close(out(a, b), torch.matmul(a, b))
