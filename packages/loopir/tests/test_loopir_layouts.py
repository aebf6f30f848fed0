"""Buffers something may observe through their strides (graph outputs, values read by eager ops)
get eager's layout: channels-last and transposed inputs give channels-last and transposed
outputs, as eager's TensorIterator does."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, verify


def _check_like_eager(fn, *args):
    kg = lower(make_fx(fn)(*args))
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


def test_a_value_used_twice_is_stored_in_eagers_layout():
    x = torch.randn(2, 6, 5, 4).to(memory_format=torch.channels_last)
    kg = _check_like_eager(lambda x: (lambda y: (y, y * y))(x.sigmoid()), x)
    assert any(step.stride != step.size and step.stride[1] == 1 for step in (o for k in kg.kernels for o in k.outputs))


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


def test_overlapping_or_symbolic_layouts_stay_contiguous():
    x = torch.randn(4, 1).expand(4, 3)  # eager's x + 1 is contiguous; no stride-0 buffer
    _check_like_eager(lambda x: x + 1, x)
    y = torch.randn(5, 7).t()
    kg = lower(make_fx(lambda y: y * 2, tracing_mode="symbolic")(y))
    torch.testing.assert_close(kg(y), y * 2)  # symbolic strides: contiguous for now, still right
