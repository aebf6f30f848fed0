"""Outputs stored into the inputs they are the new values of (`LowerOptions.input_writes`):
made where safe, refused elsewhere; either way the input ends up holding the value."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, stored_positions, verify


def _written(fn, *args, writes=((0, 0),)):
    """Lower `fn`, run it on copies of `args` (reference evaluator) and, as a caller does, copy
    each write not stored in place; check outputs and the written input; return the positions
    stored in place."""
    kg = lower(make_fx(fn)(*args), input_writes=writes)
    verify(kg)
    inputs = [a.clone() for a in args]
    outputs = kg(*inputs)
    expected = fn(*args)
    for got, want in zip(outputs, expected):
        torch.testing.assert_close(got, want)
    stored = stored_positions(kg.gm)
    for out, into in writes:
        if out not in stored:
            inputs[into].copy_(outputs[out])
    torch.testing.assert_close(inputs[writes[-1][1]], expected[writes[-1][0]], check_dtype=False)
    assert all(outputs[out] is inputs[into] for out, into in stored.items())
    stored_kernels = [k for k in kg.kernels if k.stored_inputs]
    assert len(stored_kernels) == len(stored)
    return stored


def running_mean_update(rm, x):
    return (rm * 0.9 + x.mean(0) * 0.1, x.sum(0))


def written_without_reading(x, y):
    return (y * 2, y + 1)


def test_safe_writes_are_stored_by_their_kernel():
    assert _written(running_mean_update, torch.randn(8), torch.randn(4, 8)) == {0: 0}
    assert _written(written_without_reading, torch.randn(4, 8), torch.randn(4, 8)) == {0: 0}


@pytest.mark.parametrize("fn", [
    lambda x: ((x.flip(0) + 1),),  # reads other elements than it stores
    lambda x: (x * 2, x.t()),  # another output views the input
    lambda x: (x + 1, x.sum(1) * 2),  # another node (a reduction) reads the input
    lambda x: ((x * 2).to(torch.float64),),  # another dtype
    lambda x: (x,),  # the input passed through: no kernel computes it
], ids=["other_index", "output_views_input", "other_reader", "dtype", "pass_through"])
def test_unsafe_writes_stay_the_callers_copies(fn):
    assert _written(fn, torch.randn(4, 8)) == {}


def test_two_writes_into_one_input_are_refused():
    assert _written(lambda x: (x + 1, x + 2), torch.randn(4, 8), writes=((0, 0), (1, 0))) == {}
