import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kiln.capture import CapturedGraph, SourceLocation
from kiln.capture._internal.source import parse_stack_trace


def two_graphs(x):
    y = torch.sin(x) + x
    print("kiln-capture-test: two_graphs")
    return torch.cos(y) * 3


def test_from_backend_inside_a_hand_written_backend(line_of):
    records = []

    def recording_backend(gm, example_inputs):
        records.append(CapturedGraph.from_backend(gm, example_inputs, index=len(records)))
        return gm.forward

    x = torch.randn(4)
    out = torch.compile(two_graphs, backend=recording_backend)(x)
    torch.testing.assert_close(out, two_graphs(x))
    assert [r.index for r in records] == [0, 1]
    first, second = records
    assert first.op_counts() == {"torch.sin": 1, "operator.add": 1}
    assert second.op_counts() == {"torch.cos": 1, "operator.mul": 1}
    assert first.source.lineno == line_of(two_graphs, "torch.sin")
    assert second.source.lineno == line_of(two_graphs, "torch.cos")
    assert second.source.display_function.startswith("two_graphs")
    assert first.graph_break is not None and second.graph_break is None
    assert first.graph_break.location.lineno == line_of(two_graphs, "print(")
    assert len(first.example_inputs) == 1
    text = str(first)
    assert text.startswith("graph 0 (torch IR, 2 ops)") and "torch.sin" in text
    assert "ended by graph break" in text


def test_from_backend_accepts_fake_inputs_and_plain_graphs():
    def fn(x, w):
        return torch.relu(x @ w) + x.sum()

    gm = torch.fx.symbolic_trace(fn)
    with FakeTensorMode() as mode:
        fakes = (mode.from_tensor(torch.randn(3, 3)), mode.from_tensor(torch.randn(3, 3)))
    record = CapturedGraph.from_backend(gm, fakes)
    assert record.source is None and record.graph_break is None
    assert record.example_inputs == fakes
    assert record.num_ops == 4
    assert record.op_counts() == {
        "operator.matmul": 1,
        "torch.relu": 1,
        "Tensor.sum": 1,
        "operator.add": 1,
    }


def test_parse_stack_trace_in_dynamo_and_export_formats():
    dynamo_text = (
        '  File "/src/model.py", line 10, in forward\n'
        "    y = self.block(x)\n"
        "        ^^^^^^^^^^^^^\n"
        '  File "/src/block.py", line 3, in forward\n'
        "    return x * 2\n"
    )
    export_text = 'File "/src/model.py", line 7, in forward\n    return torch.relu(x)'
    assert parse_stack_trace(dynamo_text) == [
        SourceLocation("/src/model.py", 10, "forward", "y = self.block(x)"),
        SourceLocation("/src/block.py", 3, "forward", "return x * 2"),
    ]
    assert parse_stack_trace(export_text) == [
        SourceLocation("/src/model.py", 7, "forward", "return torch.relu(x)")
    ]


def test_resume_function_names_are_shown_as_the_user_function():
    location = SourceLocation("/a.py", 5, "torch_dynamo_resume_in_my_fn_at_4", "x = 1")
    assert location.display_function == "my_fn (resumed after line 4)"
    assert str(location) == "/a.py:5 in my_fn (resumed after line 4): x = 1"
    assert SourceLocation("/a.py", 5, "my_fn").display_function == "my_fn"
