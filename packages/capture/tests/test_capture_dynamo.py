import os

import pytest
import torch

from kiln.capture import Capture, CapturedGraph, GraphBreak, capture, verify


def no_break(x):
    y = torch.sin(x) * 2
    return y + 1


def print_in_middle(x):
    y = torch.sin(x)
    print("kiln-capture-test: inside print_in_middle")
    return torch.cos(y)


def print_first(x):
    print("kiln-capture-test: first line")
    return torch.cos(x)


def data_dependent(x):
    y = x * 2
    if y.sum() > 0:
        return y + 1
    return y - 1


def helper_that_prints(y):
    print("kiln-capture-test: in helper")
    return y + 1


def calls_printing_helper(x):
    return torch.cos(helper_that_prints(torch.sin(x)))


def print_in_loop(x):
    for i in range(2):
        x = x + 1
        print("kiln-capture-test: loop", i)
    return x


def scaled(x, scale=1.0):
    return x * scale


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.linear(x)) + 1


def run_graph(graph: CapturedGraph, *inputs):
    out = graph.gm(*inputs)
    assert isinstance(out, (tuple, list)), "Dynamo graphs return a tuple"
    return out[0]


def test_function_without_break_gives_one_graph(line_of):
    x = torch.randn(3, 4)
    result = capture(no_break, x)
    assert isinstance(result, Capture)
    assert len(result.graphs) == 1 and result.breaks == ()
    graph = result.graphs[0]
    assert graph.index == 0 and graph.ir == "torch" and graph.graph_break is None
    assert graph.op_counts() == {"torch.sin": 1, "operator.mul": 1, "operator.add": 1}
    assert graph.source.filename == __file__
    assert graph.source.lineno == line_of(no_break, "torch.sin")
    torch.testing.assert_close(run_graph(graph, x), no_break(x))
    verify(graph)


def test_print_in_middle_gives_two_graphs_and_one_break(line_of):
    x = torch.randn(5)
    result = capture(print_in_middle, x)
    assert len(result.graphs) == 2 and len(result.breaks) == 1
    (graph_break,) = result.breaks
    assert isinstance(graph_break, GraphBreak)
    assert graph_break.location.filename == __file__
    assert graph_break.location.lineno == line_of(print_in_middle, "print(")
    assert graph_break.location.code_line.startswith('print("kiln-capture-test')
    assert graph_break.location.function == "print_in_middle"
    assert "print" in graph_break.hint
    first, second = result.graphs
    assert first.graph_break == graph_break and second.graph_break is None
    assert [g.index for g in result.graphs] == [0, 1]
    assert second.source.lineno == line_of(print_in_middle, "torch.cos")
    # The two graphs chained reproduce the function.
    torch.testing.assert_close(run_graph(second, run_graph(first, x)), print_in_middle(x))


def test_print_on_first_line_is_recorded_without_graph_before_it(line_of):
    result = capture(print_first, torch.randn(3))
    assert len(result.graphs) == 1
    assert [b.location.lineno for b in result.breaks] == [line_of(print_first, "print(")]


def test_data_dependent_control_flow_breaks_at_the_if(line_of):
    x = torch.ones(4)  # positive: the first branch is taken
    result = capture(data_dependent, x)
    assert len(result.graphs) == 2 and len(result.breaks) == 1
    graph_break = result.breaks[0]
    assert graph_break.location.lineno == line_of(data_dependent, "if y.sum()")
    assert "torch.where" in graph_break.hint and "torch.cond" in graph_break.hint
    assert result.graphs[1].op_counts() == {"operator.add": 1}
    # The first graph returns the branch condition and the live value y.
    outputs = result.graphs[0].gm(x)
    (condition,) = [o for o in outputs if o.dtype == torch.bool]
    (y,) = [o for o in outputs if o.dtype != torch.bool]
    assert bool(condition) is True
    torch.testing.assert_close(y, x * 2)
    torch.testing.assert_close(run_graph(result.graphs[1], y), data_dependent(x))


def test_break_inside_helper_is_reported_once_at_the_helper_line(line_of):
    result = capture(calls_printing_helper, torch.randn(3))
    assert len(result.breaks) == 1
    location = result.breaks[0].location
    assert location.function == "helper_that_prints"
    assert location.lineno == line_of(helper_that_prints, "print(")
    outer_frames = [frame.function for frame in result.breaks[0].user_stack]
    assert "helper_that_prints" in outer_frames


def test_break_in_loop_is_reported_even_when_no_graph_is_captured():
    x = torch.zeros(2)
    result = capture(print_in_loop, x)
    assert result.graphs == ()
    assert len(result.breaks) >= 1
    assert all(b.location is not None and b.location.filename == __file__ for b in result.breaks)


def test_module_parameters_become_graph_inputs():
    torch.manual_seed(0)
    net = SmallNet()
    x = torch.randn(2, 4)
    result = capture(net, x)
    assert result.function == "SmallNet"
    assert len(result.graphs) == 1 and result.breaks == ()
    graph = result.graphs[0]
    placeholders = [n for n in graph.gm.graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(graph.example_inputs) == 3  # weight, bias, x
    assert any(inp is net.linear.weight for inp in graph.example_inputs)
    assert graph.source.function == "forward"
    torch.testing.assert_close(run_graph(graph, *graph.example_inputs), net(x))
    verify(graph)


def test_dynamic_shapes_give_symbolic_placeholders():
    x = torch.randn(3, 4)
    result = capture(no_break, x, dynamic=True)
    (graph,) = result.graphs
    values = [n.meta["example_value"] for n in graph.gm.graph.nodes if n.op == "placeholder"]
    assert any(isinstance(v, torch.SymInt) for v in values)
    verify(graph)


def test_keyword_arguments_reach_the_function():
    x = torch.randn(3)
    result = capture(scaled, x, scale=3.0)
    torch.testing.assert_close(run_graph(result.graphs[0], *result.graphs[0].example_inputs), x * 3)


def test_breaks_do_not_leak_between_captures():
    assert len(capture(print_in_middle, torch.randn(2)).breaks) == 1
    assert capture(no_break, torch.randn(2)).breaks == ()


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="valid modes: dynamo, export"):
        capture(no_break, torch.randn(2), mode="trace")


def test_source_filename_is_this_file():
    result = capture(no_break, torch.randn(2))
    assert os.path.samefile(result.graphs[0].source.filename, __file__)
