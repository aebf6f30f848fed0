"""decompose() on graphs that once failed it (issue 15): tensor constants, values from several
fake modes, data-dependent output shapes in graphs traced without a ShapeEnv, and variances of
values near the float maximum."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.decomp import LOOP_LEVEL_OPS, check_opset, decompose, loop_level

CONSTANT = torch.randn(4, 8)


def _with_constants(x):
    return torch.nn.functional.layer_norm(x + CONSTANT, (8,)).softmax(-1) + torch.tensor([1.0, 2.0] * 4)


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_graphs_holding_tensor_constants(mode):
    x = torch.randn(4, 8)
    gm = make_fx(_with_constants, tracing_mode=mode, _allow_non_fake_inputs=True)(x)
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    out = decompose(gm, loop_level())
    check_opset(out, LOOP_LEVEL_OPS)
    torch.testing.assert_close(out(x), _with_constants(x))


def test_placeholder_values_from_different_fake_modes():
    def f(x, y):
        return torch.softmax(x * y, -1)

    x, y = torch.randn(3, 5), torch.randn(3, 5)
    gm = make_fx(f, tracing_mode="fake")(x, y)
    second = next(n for n in gm.graph.nodes if n.op == "placeholder" and n.name.startswith("y"))
    with FakeTensorMode() as other_mode:  # as a graph pieced together from two traces has
        second.meta["val"] = torch.empty(3, 5)
    assert second.meta["val"].fake_mode is other_mode
    out = decompose(gm, loop_level())
    check_opset(out, LOOP_LEVEL_OPS)
    torch.testing.assert_close(out(x, y), f(x, y))


def _data_dependent(x):
    unique = torch.unique_consecutive(x.round())
    return unique.sum() + x.var(), unique * 2


@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_data_dependent_output_shapes(mode):
    """unique_consecutive's size is an unbacked symbol, also when make_fx traced in real mode
    (whose values come with no ShapeEnv to hold one)."""
    x = torch.tensor([1.0, 1.0, 2.0, 2.2, 3.0, 1.0])
    gm = make_fx(_data_dependent, tracing_mode=mode)(x)
    out = decompose(gm, loop_level())
    assert any(n.target is torch.ops.aten.unique_consecutive.default for n in out.graph.nodes)
    for args in [x, torch.tensor([5.0, 4.0, 4.0, 4.0, 1.0, 1.0])]:
        torch.testing.assert_close(out(args), _data_dependent(args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_variance_is_computed_on_shifted_data(dtype):
    """Rows of one huge value: eager's Welford gives variance 0; a plain two-pass overflows its
    sum (float32), or squares the mean's rounding error (float64: 1e45 instead of 0)."""
    x = torch.full((3, 64), 3e38, dtype=dtype)
    x[1] = 1e4 + torch.arange(64, dtype=dtype)
    x[2] = 0

    def statistics(x):
        return torch.var_mean(x, -1), x.var(1, keepdim=True), x.std(-1, correction=0)

    out = decompose(make_fx(statistics, tracing_mode="symbolic")(x), loop_level())
    check_opset(out, LOOP_LEVEL_OPS)
    got = out(x)
    torch.testing.assert_close(got, statistics(x))
    assert got[0][0][0] == 0 and got[0][1][0] == x[0, 0]


def test_variance_of_an_empty_reduction_is_nan_as_eager():
    x = torch.randn(3, 0)
    out = decompose(make_fx(lambda x: (x.var(-1), torch.var_mean(x, 1)))(x), loop_level())
    torch.testing.assert_close(out(x), (x.var(-1), torch.var_mean(x, 1)), equal_nan=True)


def test_item_of_an_unspecialized_float_input():
    """Dynamo with dynamic=True passes a float (here ``math.pi``) as a 0-d tensor the graph
    ``.item()``s; its fake remembers the SymFloat, but the placeholders of a graph traced from
    it (make_fx, autograd_trace) hold detached fakes that forget it. decompose takes the value
    from the ``.item()`` node, as the graph recorded it."""
    import math

    import torch._dynamo
    from torch._guards import detect_fake_mode

    decomposed = []

    def backend(gm, example_inputs):
        fake_mode = detect_fake_mode(example_inputs)
        fakes = [fake_mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in example_inputs]
        with fake_mode:
            traced = make_fx(gm, tracing_mode="real")(*fakes)
        assert any(n.target is torch.ops.aten._local_scalar_dense.default for n in traced.graph.nodes)
        decomposed.append(decompose(traced, loop_level()))
        return decomposed[-1]

    def f(x):
        return torch.tanh(math.sqrt(2.0 / math.pi) * x)

    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(suppress_errors=False):
            compiled = torch.compile(f, backend=backend, dynamic=True)
            for rows in (3, 6):
                x = torch.randn(rows, 4)
                torch.testing.assert_close(compiled(x), f(x))
    finally:
        torch._dynamo.reset()
    assert len(decomposed) == 1
