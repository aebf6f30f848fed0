import torch

from kiln.capture import CaptureSession, Recompile
from kiln.capture._internal.recompiles import parse_recompile
from kiln.capture._internal.source import SourceLocation


def scaled_sin(x, n=2):
    y = torch.sin(x) * n
    return y + 1


def branchy(x, flag):
    y = torch.cos(x)
    if flag:
        y = y * 3
    return y


def run(fn, *calls):
    """Call the compiled ``fn`` once per argument tuple inside a session; return the Capture."""
    with CaptureSession() as session:
        compiled = session.compile(fn)
        for args in calls:
            compiled(*args)
    return session.result()


def test_same_inputs_do_not_recompile():
    result = run(scaled_sin, (torch.randn(3),), (torch.randn(3),))
    assert len(result.graphs) == 1 and result.recompiles == ()


def test_new_shape_records_the_size_guard_and_the_dynamic_graph(line_of):
    result = run(scaled_sin, (torch.randn(3),), (torch.randn(5),))
    assert len(result.graphs) == 2
    (recompile,) = result.recompiles
    assert isinstance(recompile, Recompile)
    assert "size mismatch" in recompile.guard and "'x'" in recompile.guard
    assert "expected 3, actual 5" in recompile.guard
    assert recompile.failed_entry == result.graphs[0].compile_id
    assert recompile.compile_id == result.graphs[1].compile_id != result.graphs[0].compile_id
    assert recompile.function.filename == __file__
    assert recompile.function.lineno == line_of(scaled_sin, "def scaled_sin")
    assert "mark_dynamic" in recompile.hint and not recompile.gave_up
    # Dynamo recompiled with a symbolic size: the new graph's input says so.
    (spec,) = [s for s in result.graphs[1].input_specs() if s.kind == "tensor"]
    assert isinstance(spec.shape[0], str)


def test_new_dtype_records_the_dtype_guard():
    result = run(scaled_sin, (torch.randn(3),), (torch.randn(3, dtype=torch.float64),))
    (recompile,) = result.recompiles
    assert "dtype mismatch" in recompile.guard
    assert "Float" in recompile.guard and "Double" in recompile.guard
    assert "dtype" in recompile.hint
    assert [s.dtype for s in result.graphs[1].input_specs()] == [torch.float64]


def test_python_value_guard_points_at_the_line_that_used_it(line_of):
    result = run(branchy, (torch.randn(3), True), (torch.randn(3), False))
    (recompile,) = result.recompiles
    assert recompile.guard.replace(" ", "") in ("flag==True", "L['flag']==True")
    assert recompile.location.filename == __file__
    assert recompile.location.lineno == line_of(branchy, "if flag:")
    assert "bool" in recompile.hint
    assert result.graphs[0].op_counts() != result.graphs[1].op_counts()


def test_report_lists_recompiles_with_function_guard_and_line(line_of):
    result = run(branchy, (torch.randn(3), True), (torch.randn(3), False))
    text = result.report()
    assert "2 graphs, 0 graph breaks, 1 recompile\n" in text
    recompile = result.recompiles[0]
    assert f"recompile 1: branchy (compile {recompile.compile_id} -> graph 1)\n" in text
    assert f"  function: {__file__}:{line_of(branchy, 'def branchy')}\n" in text
    assert f"  guard of compile {recompile.failed_entry} failed: {recompile.guard}\n" in text
    assert f"  guarded value used at {__file__}:{line_of(branchy, 'if flag:')} in branchy\n" in text
    assert "    if flag:\n" in text


def test_recompile_limit_is_reported_as_giving_up():
    calls = [
        (torch.randn(3, dtype=dtype),) for dtype in (torch.float32, torch.float64, torch.float16)
    ]
    with torch._dynamo.config.patch(recompile_limit=2):
        result = run(scaled_sin, *calls)
    assert len(result.graphs) == 2
    last = result.recompiles[-1]
    assert last.gave_up and "recompile_limit" in last.hint
    assert "gave up" in result.report()


def test_wrapped_backend_receives_every_graph():
    seen = []

    def inner(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    with CaptureSession() as session:
        compiled = torch.compile(scaled_sin, backend=session.wrap_backend(inner))
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), scaled_sin(x))
    result = session.result("scaled_sin")
    assert [g.gm for g in result.graphs] == seen and len(seen) == 1


def test_parse_recompile_of_tensor_and_value_guards():
    fn = SourceLocation("/m.py", 3, "f")
    tensor = parse_recompile("1/0", fn, "0/0: tensor 'x' rank mismatch. expected 1, actual 2")
    assert tensor.failed_entry == "0/0" and tensor.guard.startswith("tensor 'x' rank")
    assert "rank" in tensor.hint and tensor.location is None
    value = parse_recompile(
        "0/2",
        fn,
        "0/1: n == 2                          # y = x * n  # m.py:4 in f\n"
        "User stack trace:\n"
        '  File "/m.py", line 4, in f\n'
        "    y = x * n",
    )
    assert value.guard == "n == 2" and value.failed_entry == "0/1"
    assert value.location == SourceLocation("/m.py", 4, "f", "y = x * n")
    assert "number" in value.hint
    state = parse_recompile("0/3", fn, "0/2: GLOBAL_STATE changed: grad_mode ")
    assert "grad mode" in state.hint
    assert str(state) == "f (m.py:3) recompiled as 0/3: GLOBAL_STATE changed: grad_mode"
