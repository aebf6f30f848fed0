import copy

import pytest
import torch

from kiln.capture import CapturedGraph, GraphFileError, capture, load, save, verify
from kiln.capture._internal.graph_file import file_header


def affine_with_view(x, n):
    y = torch.sin(x) * n
    z = y.view(-1)[1:]
    return z.sum(0) + x.shape[0], z


def with_print(x):
    y = torch.relu(x) + 1
    print("kiln-capture-test: with_print")
    return y * 2


def with_cond(x):
    return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))


class TiedBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)
        self.second.weight = self.first.weight
        self.register_buffer("shift", torch.arange(4.0))

    def forward(self, x):
        return self.second(torch.relu(self.first(x))) + self.shift


def concrete(inputs):
    """Dynamo passes SymInts for symbolic sizes; run graphs on their example values."""
    return [int(v.node.hint) if isinstance(v, torch.SymInt) else v for v in inputs]


def fake_value(node):
    return node.meta.get("example_value", node.meta.get("val"))


def assert_same_graph(original: CapturedGraph, loaded: CapturedGraph):
    """Same nodes, targets, code, metadata and record fields; identical outputs."""
    assert loaded.gm.code == original.gm.code
    pairs = list(zip(original.gm.graph.nodes, loaded.gm.graph.nodes, strict=True))
    for old, new in pairs:
        assert (new.name, new.op, new.target) == (old.name, old.op, old.target)
        assert new.meta.get("stack_trace") == old.meta.get("stack_trace")
        old_value, new_value = fake_value(old), fake_value(new)
        if isinstance(old_value, torch.Tensor):
            assert str(new_value.shape) == str(old_value.shape), new.name
            assert str(new_value.stride()) == str(old_value.stride()), new.name
            assert (new_value.dtype, new_value.device) == (old_value.dtype, old_value.device)
            assert new_value.requires_grad == old_value.requires_grad
    assert loaded.input_specs() == original.input_specs()
    assert (loaded.index, loaded.ir, loaded.compile_id) == (
        original.index,
        original.ir,
        original.compile_id,
    )
    assert (loaded.source, loaded.graph_break) == (original.source, original.graph_break)
    expected = original.gm(*concrete(original.example_inputs))
    actual = loaded.gm(*loaded.example_inputs)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert torch.equal(a, e)
    verify(loaded)


def round_trip(graph, tmp_path, **load_options):
    path = save(graph, tmp_path / "graph.kcg")
    assert path.is_file()
    return load(path, **load_options)


def test_dynamo_graph_round_trips(tmp_path):
    (graph,) = capture(affine_with_view, torch.randn(4, 3), 2).graphs
    assert_same_graph(graph, round_trip(graph, tmp_path))


def test_symbolic_sizes_keep_their_names_and_the_graph_stays_dynamic(tmp_path):
    (graph,) = capture(affine_with_view, torch.randn(4, 3), 2, dynamic=True).graphs
    loaded = round_trip(graph, tmp_path)
    assert_same_graph(graph, loaded)
    (tensor_spec,) = [s for s in loaded.input_specs() if s.kind == "tensor"]
    assert all(isinstance(d, str) for d in tensor_spec.shape)
    assert loaded.example_inputs[:2] == (4, 3)  # symbolic ints come back as their values
    # Other sizes run too: the loaded graph is the dynamic graph, not a specialization.
    x = torch.randn(6, 5)
    total, tail = loaded.gm(6, 5, x, 3)
    expected_total, expected_tail = affine_with_view(x, 3)
    torch.testing.assert_close(total, expected_total)
    torch.testing.assert_close(tail, expected_tail)


def test_views_share_their_base_storage_after_load(tmp_path):
    (graph,) = capture(affine_with_view, torch.randn(4, 3), 2).graphs
    loaded = round_trip(graph, tmp_path)
    nodes = {n.name: fake_value(n) for n in loaded.gm.graph.nodes}
    storage = nodes["y"].untyped_storage()._cdata
    assert nodes["view"].untyped_storage()._cdata == storage
    assert nodes["z"].untyped_storage()._cdata == storage
    assert nodes["sin"].untyped_storage()._cdata != storage


def test_graph_ended_by_a_break_keeps_its_break_record(tmp_path):
    result = capture(with_print, torch.randn(3))
    first = result.graphs[0]
    loaded = round_trip(first, tmp_path)
    assert loaded.graph_break == first.graph_break == result.breaks[0]
    assert_same_graph(first, loaded)


def test_export_graph_keeps_parameters_buffers_and_tied_weights(tmp_path):
    torch.manual_seed(0)
    block = TiedBlock()
    (graph,) = capture(block, torch.randn(2, 4), mode="export").graphs
    loaded = round_trip(graph, tmp_path)
    assert_same_graph(graph, loaded)
    assert isinstance(loaded.gm.first.weight, torch.nn.Parameter)
    assert loaded.gm.first.weight is loaded.gm.second.weight
    assert "shift" in dict(loaded.gm.named_buffers())
    assert all(
        isinstance(n.target, torch._ops.OpOverload)
        for n in loaded.gm.graph.nodes
        if n.op == "call_function"
    )


@pytest.mark.parametrize("mode", ["dynamo", "export"])
def test_higher_order_op_bodies_are_saved_as_nested_graphs(tmp_path, mode):
    (graph,) = capture(with_cond, torch.randn(3), mode=mode).graphs
    loaded = round_trip(graph, tmp_path)
    assert_same_graph(graph, loaded)
    children = dict(loaded.gm.named_children())
    assert len(children) == 2 and all(
        isinstance(c, torch.fx.GraphModule) for c in children.values()
    )
    negative = -torch.ones(3)
    torch.testing.assert_close(loaded.gm(negative)[0], negative.cos())


def test_plain_graph_module_with_example_inputs(tmp_path):
    gm = torch.fx.symbolic_trace(lambda x, y: torch.matmul(x, y).relu())
    inputs = (torch.randn(2, 3), torch.randn(3, 4))
    path = save(gm, tmp_path / "plain.kcg", example_inputs=inputs)
    loaded = load(path)
    assert loaded.ir == "torch" and loaded.source is None
    assert torch.equal(loaded.gm(*loaded.example_inputs), gm(*inputs))


def test_untrusted_modules_are_not_imported_unless_trusted(tmp_path):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    copied = graph.call_function(copy.deepcopy, (x,))
    graph.output(graph.call_function(torch.add, (copied, x)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    path = save(gm, tmp_path / "copy.kcg", example_inputs=(torch.ones(2),))
    with pytest.raises(GraphFileError, match=r"copy\.deepcopy.*trusted_modules=\('copy',\)"):
        load(path)
    loaded = load(path, trusted_modules=("copy",))
    assert torch.equal(loaded.gm(torch.ones(2)), torch.full((2,), 2.0))


def test_unsavable_targets_and_modules_name_the_node(tmp_path):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(lambda t: t + 1, (x,), name="plus_one"))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(GraphFileError, match="cannot save node 'plus_one'.*lambda"):
        save(gm, tmp_path / "lambda.kcg")
    traced = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(GraphFileError, match="calls the Linear module"):
        save(traced, tmp_path / "module.kcg")
    assert not (tmp_path / "lambda.kcg").exists() and not (tmp_path / "module.kcg").exists()


def rewrite(path, change):
    payload = torch.load(path, weights_only=True)
    change(payload)
    torch.save(payload, path)


def saved_graph(tmp_path):
    (graph,) = capture(TiedBlock(), torch.randn(2, 4), mode="export").graphs
    return save(graph, tmp_path / "block.kcg")


def test_newer_format_version_is_refused_with_advice(tmp_path):
    path = saved_graph(tmp_path)
    rewrite(path, lambda p: p["kiln_capture"].update(format_version=99))
    with pytest.raises(GraphFileError, match="format 99.*reads format 1: upgrade kiln-capture"):
        load(path)


def test_other_torch_major_version_is_refused(tmp_path):
    path = saved_graph(tmp_path)
    rewrite(path, lambda p: p["kiln_capture"].update(torch_version="1.13.1"))
    with pytest.raises(GraphFileError, match=r"saved with torch 1\.13\.1.*load it with torch 1\.x"):
        load(path)


def test_changed_operator_schema_is_refused(tmp_path):
    path = saved_graph(tmp_path)

    def change_schema(payload):
        payload["body"] = payload["body"].replace("aten::relu(Tensor self)", "aten::relu(Tensor x)")

    rewrite(path, change_schema)
    with pytest.raises(GraphFileError, match="operator aten.relu.default changed"):
        load(path)


def test_files_that_are_not_graph_files_are_refused(tmp_path):
    torch.save({"weights": torch.ones(2)}, tmp_path / "weights.pt")
    with pytest.raises(GraphFileError, match="not a kiln.capture graph file"):
        load(tmp_path / "weights.pt")
    (tmp_path / "junk.kcg").write_bytes(b"not a zip file at all")
    with pytest.raises(GraphFileError, match="not a kiln.capture graph file, or it is damaged"):
        load(tmp_path / "junk.kcg")


def test_header_names_the_versions():
    header = file_header()
    assert header["format"] == "kiln-capture-graph" and header["format_version"] == 1
    assert header["torch_version"] == str(torch.__version__)


def data_dependent_sizes(x):
    scale = x.sum().item()
    positive = torch.nonzero(x > 0)
    return x * scale, positive.float().sum() + positive.shape[0]


def test_unbacked_sizes_and_their_ranges_survive(tmp_path):
    with torch._dynamo.config.patch(
        capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True
    ):
        (graph,) = capture(data_dependent_sizes, torch.randn(5)).graphs
    loaded = round_trip(graph, tmp_path)
    assert_same_graph(graph, loaded)
    (nonzero,) = [n for n in loaded.gm.graph.nodes if n.target is torch.nonzero]
    rows = fake_value(nonzero).shape[0]
    assert isinstance(rows, torch.SymInt) and str(rows).startswith("u")
    value_range = rows.node.shape_env.var_to_range[rows.node.expr]
    assert (int(value_range.lower), int(value_range.upper)) == (0, 5)


def test_fake_example_inputs_come_back_fake(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    gm = torch.fx.symbolic_trace(lambda x, w: torch.relu(x @ w))
    with FakeTensorMode() as mode:
        fakes = (mode.from_tensor(torch.randn(3, 2)), mode.from_tensor(torch.randn(2, 4)))
    loaded = round_trip(CapturedGraph.from_backend(gm, fakes), tmp_path)
    assert all(isinstance(v, FakeTensor) for v in loaded.example_inputs)
    assert [tuple(v.shape) for v in loaded.example_inputs] == [(3, 2), (2, 4)]
