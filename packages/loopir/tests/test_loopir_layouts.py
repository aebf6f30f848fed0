"""Buffers something may observe through their strides (graph outputs, values read by eager ops)
get eager's layout: channels-last and transposed inputs give channels-last and transposed
outputs, as eager's TensorIterator does."""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, verify


def assert_innermost_contiguous(kg, pointwise_only=False):
    """Every load and store of every (pointwise) node moves by one element per step of its
    innermost loop variable: the loops run in the buffers' memory order."""
    for kernel in kg.kernels:
        for node in kernel.nodes:
            if pointwise_only and node.reduction_ranges:
                continue
            index, rindex = kernel.placement(node)
            innermost = (rindex or index)[-1]
            for access in node.accesses_at(index, rindex).accesses:
                coefficient = sympy.expand(access.index).coeff(innermost)
                assert coefficient == 1, (kernel.name, node.name, access)


def _check_like_eager(fn, *args, tracing_mode="real"):
    kg = lower(make_fx(fn, tracing_mode=tracing_mode)(*args))
    verify(kg)
    got, expected = kg(*args), fn(*args)
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
        assert g.stride() == e.stride(), (g.stride(), e.stride())
    return kg


@pytest.mark.parametrize("layout", ["channels_last", "transposed", "permuted"])
def test_pointwise_and_reduction_outputs_keep_eagers_layout(layout):
    x = torch.randn(2, 6, 5, 4)
    x = {"channels_last": x.to(memory_format=torch.channels_last), "transposed": x.transpose(2, 3),
         "permuted": x.permute(3, 1, 0, 2).contiguous().permute(2, 1, 3, 0)}[layout]
    _check_like_eager(lambda x: (x + 1, x.exp() * x, (x * 2).sum(1, keepdim=True), x.amax(-1, keepdim=True)), x)


@pytest.mark.parametrize("first", ["channels_last", "contiguous"])
@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_copysign_of_mixed_layouts_follows_eagers_first_operand(layout, first):
    """copysign's fake is laid out as torch's reference decomposition (`where(signbit(b), ...)`
    follows `b`); eager's kernel follows `a`. kiln gives eager's strides, stored and returned."""
    x = torch.randn(2, 6, 5, 4)
    other = x.to(memory_format=torch.channels_last) if layout == "channels_last" else x.transpose(2, 3)
    plain = torch.randn(other.shape)
    a, b = (other, plain) if first == "channels_last" else (plain, other)
    for mode in ("fake", "symbolic"):
        _check_like_eager(lambda a, b: (lambda y: (torch.copysign(a, b), y, y + 1))(torch.copysign(a, b)), a, b,
                          tracing_mode=mode)


def test_a_value_used_twice_is_stored_in_eagers_layout():
    x = torch.randn(2, 6, 5, 4).to(memory_format=torch.channels_last)
    kg = _check_like_eager(lambda x: (lambda y: (y, y * y))(x.sigmoid()), x)
    assert_innermost_contiguous(kg)


def test_as_strided_of_a_computed_channels_last_value_reads_eagers_elements():
    # the case: eager's `x + 1` keeps x's channels-last layout and as_strided addresses
    # its storage; a contiguous `x + 1` would put other elements at those strides
    aten = torch.ops.aten
    x = torch.randn(8, 384, 20, 20).to(memory_format=torch.channels_last)
    gm = make_fx(lambda x: x + 1)(x)
    kg = lower(gm)
    out = kg(x)
    assert out.stride() == (x + 1).stride()
    view = aten.as_strided(out, (8, 384, 2, 20, 12), (153600, 1, 61440, 384, 7680), 0) + 2
    torch.testing.assert_close(view, aten.as_strided(x + 1, (8, 384, 2, 20, 12), (153600, 1, 61440, 384, 7680), 0) + 2)


def test_overlapping_layouts_stay_contiguous():
    x = torch.randn(4, 1).expand(4, 3)  # eager's x + 1 is contiguous; no stride-0 buffer
    _check_like_eager(lambda x: x + 1, x)


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_symbolic_layouts_are_eagers_at_every_size(layout):
    # dynamic shapes: the strides are expressions of the size symbols, ordered as the example's
    make = {"channels_last": lambda *s: torch.randn(*s).to(memory_format=torch.channels_last),
            "transposed": lambda *s: torch.randn(*s).transpose(1, 3)}[layout]
    kg = lower(make_fx(lambda x: (x * 2, x.sum(2, keepdim=True)), tracing_mode="symbolic")(make(2, 3, 4, 5)))
    verify(kg)
    assert_innermost_contiguous(kg, pointwise_only=True)
    for sizes in ((2, 3, 4, 5), (3, 7, 2, 6)):
        x = make(*sizes)
        for got, expected in zip(kg(x), (x * 2, x.sum(2, keepdim=True))):
            torch.testing.assert_close(got, expected)
            assert got.stride() == expected.stride(), (got.stride(), expected.stride())


def test_empty_strided_keeps_strides_with_gaps():
    kg = lower(make_fx(lambda: (torch.empty_strided((4, 5), (8, 1)), torch.empty_strided((4, 5), (1, 6))))())
    verify(kg)
    assert [o.stride() for o in kg()] == [(8, 1), (1, 6)]


@pytest.mark.parametrize("layout", ["channels_last", "transposed", "permuted"])
def test_pointwise_loops_run_in_the_outputs_memory_order(layout):
    # a channels-last (transposed, permuted) pointwise kernel walks its input and output
    # consecutively in its innermost loop: vectorizable on CPU, coalesced on GPU
    x = torch.randn(2, 6, 5, 4)
    x = {"channels_last": x.to(memory_format=torch.channels_last), "transposed": x.transpose(2, 3),
         "permuted": x.permute(3, 1, 0, 2).contiguous().permute(2, 1, 3, 0)}[layout]
    kg = _check_like_eager(lambda x: (x * 2 + 1, torch.where(x > 0, x.exp(), -x)), x)
    assert_innermost_contiguous(kg)
    assert len(kg.kernels) == 1  # both outputs in one loop nest


def test_memory_order_loops_of_a_symbolic_channels_last_value():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    kg = lower(make_fx(lambda x: x.sigmoid() * x, tracing_mode="symbolic")(x))
    assert_innermost_contiguous(kg)
    for shape in ((2, 3, 4, 5), (1, 7, 3, 2)):
        y = torch.randn(shape).to(memory_format=torch.channels_last)
        got = kg(y)
        torch.testing.assert_close(got, y.sigmoid() * y)
        assert got.stride() == (y.sigmoid() * y).stride()
