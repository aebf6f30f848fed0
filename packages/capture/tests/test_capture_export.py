import torch

from kiln.capture import capture, verify


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.register_buffer("shift", torch.arange(3.0))

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2 + self.shift


def scaled_sum(x, y, scale=1.0):
    return (x * y).sum(1) * scale


def call_targets(graph):
    return [n.target for n in graph.gm.graph.nodes if n.op == "call_function"]


def test_export_of_module_gives_aten_ops_and_matches_eager():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 4)
    result = capture(block, x, mode="export")
    assert result.mode == "export" and result.breaks == ()
    assert isinstance(result.exported_program, torch.export.ExportedProgram)
    (graph,) = result.graphs
    assert graph.ir == "aten"
    targets = call_targets(graph)
    assert targets, "the graph computes something"
    assert all(isinstance(t, torch._ops.OpOverload) and t.namespace == "aten" for t in targets)
    assert torch.ops.aten.relu.default in targets
    assert all(n.op != "call_module" for n in graph.gm.graph.nodes), "no guard submodule left"
    assert graph.source.function == "forward"
    (out,) = graph.gm(*graph.example_inputs)
    torch.testing.assert_close(out, block(x))
    verify(graph)


def test_export_of_function_with_keyword_argument(line_of):
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    result = capture(scaled_sum, x, y, mode="export", scale=0.5)
    (graph,) = result.graphs
    names = [n.name for n in graph.gm.graph.nodes if n.op == "placeholder"]
    assert names == ["x", "y", "scale"]
    assert graph.example_inputs[2] == 0.5
    # Export traces through the wrapper; the source falls back to the function's def line.
    assert graph.source.filename == __file__
    assert graph.source.lineno == line_of(scaled_sum, "def scaled_sum")
    (out,) = graph.gm(*graph.example_inputs)
    torch.testing.assert_close(out, scaled_sum(x, y, scale=0.5))
    verify(graph)


def test_export_dynamic_runs_on_other_batch_sizes():
    torch.manual_seed(0)
    block = Block()
    result = capture(block, torch.randn(3, 4), mode="export", dynamic=True)
    (graph,) = result.graphs
    (x_node,) = [n for n in graph.gm.graph.nodes if n.op == "placeholder"]
    assert isinstance(x_node.meta["val"].shape[0], torch.SymInt)
    other = torch.randn(7, 4)
    (out,) = graph.gm(other)
    torch.testing.assert_close(out, block(other))


def test_export_static_by_default():
    result = capture(Block(), torch.randn(3, 4), mode="export")
    (x_node,) = [n for n in result.graphs[0].gm.graph.nodes if n.op == "placeholder"]
    assert x_node.meta["val"].shape == (3, 4)
    assert all(isinstance(d, int) for d in x_node.meta["val"].shape)


def weighted_pair(pair, weights):
    return pair[0] * weights["a"] + pair[1] * weights["b"]


def test_export_flattens_nested_inputs_in_placeholder_order():
    a, b, wa, wb = (torch.randn(3) for _ in range(4))
    # kwargs given out of signature order still land on the right placeholders
    result = capture(weighted_pair, weights={"b": wb, "a": wa}, pair=[a, b], mode="export")
    (graph,) = result.graphs
    placeholders = [n for n in graph.gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(graph.example_inputs) == 4
    (out,) = graph.gm(*graph.example_inputs)
    torch.testing.assert_close(out, a * wa + b * wb)
    verify(graph)
