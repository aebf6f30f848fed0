"""The reference evaluator raises where eager raises: out-of-range indirect indices (after
negative indices wrap) and integer division or remainder by zero; it never reads out of bounds."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower

INDEXING = {
    "index": lambda x, i: x[i] * 2,
    "index_select": lambda x, i: torch.index_select(x, 0, i),
    "gather": lambda x, i: torch.gather(x, 0, i),
    "gather_sum": lambda x, i: torch.gather(x, 0, i).sum(),
}


def lowered(fn, *args):
    return lower(make_fx(fn, tracing_mode="fake")(*args))


@pytest.mark.parametrize("name", INDEXING)
@pytest.mark.parametrize("bad", [5, 7, -6, -100])
def test_out_of_range_index_raises(name, bad):
    x, fn = torch.arange(5.0), INDEXING[name]
    index = torch.tensor([0, bad, 1])
    with pytest.raises((IndexError, RuntimeError)):
        fn(x, index)  # eager refuses it too
    # index.Tensor wraps negative indices (-6 stays outside); gather and index_select refuse any
    # negative index, which their lowering turns into the size (5) before the range check
    shown = bad if name == "index" or bad >= 0 else 5
    with pytest.raises(IndexError, match=rf"kernel0, buffer buf\d+ .*index {shown} is out of bounds for a "
                                         "dimension of size 5"):
        lowered(fn, x, index)(x, index)


@pytest.mark.parametrize("name", ["index_select", "gather"])
def test_negative_indices_of_gathers_raise_as_in_eager(name):
    x, index, fn = torch.arange(5.0), torch.tensor([0, -1, 1]), INDEXING[name]
    with pytest.raises((IndexError, RuntimeError)):
        fn(x, index)
    with pytest.raises(IndexError, match="out of bounds"):
        lowered(fn, x, torch.tensor([0, 1, 1]))(x, index)


def test_negative_indices_wrap():
    x, index = torch.arange(10.0).view(5, 2), torch.tensor([-1, -5, 4, 0])
    fn = INDEXING["index"]
    torch.testing.assert_close(lowered(fn, x, index)(x, index), fn(x, index))


DIVISIONS = {
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": torch.remainder,
    "fmod": torch.fmod,
}


@pytest.mark.parametrize("name", DIVISIONS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_division_by_zero_raises_like_eager(name, dtype):
    a, b = torch.tensor([5, -3, 7], dtype=dtype), torch.tensor([2, 0, 1], dtype=dtype)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        DIVISIONS[name](a, b)
    with pytest.raises(RuntimeError, match=r"kernel0, buffer buf0 \(from \w+\): ZeroDivisionError"):
        lowered(DIVISIONS[name], a, b)(a, b)


@pytest.mark.parametrize("name", DIVISIONS)
def test_float_division_by_zero_stays_ieee(name):
    a, b = torch.tensor([5.0, -3.0, 0.0]), torch.tensor([0.0, 0.0, 0.0])
    torch.testing.assert_close(lowered(DIVISIONS[name], a, b)(a, b), DIVISIONS[name](a, b), equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_smallest_integer_divided_by_minus_one_wraps(dtype):
    smallest = torch.iinfo(dtype).min
    a, b = torch.tensor([smallest, 7], dtype=dtype), torch.tensor([-1, -1], dtype=dtype)
    # eager's trunc division traps on this (SIGFPE); floor division wraps, so trunc must agree
    expected = torch.div(a, b, rounding_mode="floor")
    torch.testing.assert_close(lowered(DIVISIONS["trunc"], a, b)(a, b), expected)
    for name in ("floor", "remainder", "fmod"):
        torch.testing.assert_close(lowered(DIVISIONS[name], a, b)(a, b), DIVISIONS[name](a, b))
