"""Training outputs keep eager's strides and can be modified in place (issue 19): an output loopir
computes in memory order (a channels-last value, `(x + 1).t()`) owns its buffer instead of
being a view of it, and one that views a buffer the graph reads again is a copy; a view
returned through the training runtime's `autograd.Function` raised on in-place ops."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend, explain

OPTIONS = {"fallback": False, "codegen": "reference"}


def _channels_last():
    return torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)


CASES = {
    "channels_last_pointwise": (lambda x: (x * 2 + 1,), _channels_last),
    "transpose_of_intermediate": (lambda x: ((x + 1).t(),), lambda: torch.randn(4, 5)),
    "select_of_channels_last": (lambda x: ((x * 2).select(2, 0),), _channels_last),
    "view_of_a_value_read_again": (lambda x: (x.exp().sum(0), x.exp().t()), lambda: torch.randn(4, 5)),
}


@pytest.mark.parametrize("name", CASES)
def test_training_outputs_have_eagers_strides_and_take_in_place_ops(name):
    fn, make_input = CASES[name]
    torch._dynamo.reset()
    assert explain(fn, make_input().requires_grad_(), options=OPTIONS).kernel_count >= 1
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options=OPTIONS))
    x = make_input()
    x_kiln, x_eager = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, expected = compiled(x_kiln), fn(x_eager)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
        assert g.stride() == e.stride()
        assert g._base is None
    scaled = [g.mul(1.0) for g in got]  # eager saved exp's result: modified in place, it would refuse backward
    got[-1].mul_(3)  # autograd refused this on a view created inside the Function
    sum(s.sum() for s in scaled).backward()
    sum(e.mul(1.0).sum() for e in expected).backward()
    torch.testing.assert_close(x_kiln.grad, x_eager.grad)


@pytest.mark.parametrize("read_again", [False, True])
def test_a_training_expand_of_an_intermediate_has_eagers_stride_0(read_again):
    """An expand of an intermediate leaves the autograd.Function as a view (stride 0): eager
    modifies no such view in place either (its elements overlap), so nothing a copy allowed is
    lost; also when the graph reads the expanded value again (a copy was made of shared views)."""
    def fn(x):
        y = x + 1
        return (y.expand(3, 4, 5), y.exp().sum()) if read_again else (y.expand(3, 4, 5),)

    torch._dynamo.reset()
    assert explain(fn, torch.randn(4, 5, requires_grad=True), options=OPTIONS).kernel_count >= 1
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options=OPTIONS))
    x = torch.randn(4, 5)
    x_kiln, x_eager = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, expected = compiled(x_kiln), fn(x_eager)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
        assert g.stride() == e.stride()
    for g, e in ((got[0], expected[0]), (got[0].detach(), expected[0].detach())):
        with pytest.raises(RuntimeError):
            e.mul_(2)
        with pytest.raises(RuntimeError):
            g.mul_(2)
    sum((g * torch.arange(g.numel()).view(g.shape)).sum() for g in got).backward()
    sum((e * torch.arange(e.numel()).view(e.shape)).sum() for e in expected).backward()
    torch.testing.assert_close(x_kiln.grad, x_eager.grad)
