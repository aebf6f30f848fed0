"""Outputs that view a kernel's buffer: no view of a buffer nothing else reads (eager's result is
no view; an autograd.Function's view output could not be modified in place), and with
`output_views=False` (training) copies of views of a buffer the graph reads again."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, verify


def _lowered(fn, *args, **options):
    kg = lower(make_fx(fn)(*args), **options)
    verify(kg)
    return kg


def test_an_output_computed_in_memory_order_owns_its_buffer():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    kg = _lowered(lambda x: (x * 2 + 1, (x - 1).transpose(0, 3)), x)
    assert "restrided_buffer" in kg.gm.code and "strided_view(" not in kg.gm.code
    for got, expected in zip(kg(x), (x * 2 + 1, (x - 1).transpose(0, 3))):
        torch.testing.assert_close(got, expected)
        assert got.stride() == expected.stride() and got._base is None


def test_a_view_of_a_buffer_read_again_is_copied_only_without_output_views():
    x = torch.randn(4, 5)

    def fn(x):
        y = x.exp()
        return y.sum(0), y.t()

    for output_views in (True, False):
        kg = _lowered(fn, x, output_views=output_views)
        summed, transposed = kg(x)
        torch.testing.assert_close(transposed, x.exp().t())
        assert transposed.stride() == (1, 5)
        assert ("copied_view" in kg.gm.code) == (not output_views)
        assert (transposed._base is None) == (not output_views)
