"""`LowerOptions.split_reductions`: a long sum/prod/max/min into few outputs becomes partial
reductions over chunks of its first reduced dim, then a reduction of the partials."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import Reduction, lower, verify
from kiln.loopir._internal.lower_split import split_factor


def _reductions(kg):
    return [n for k in kg.kernels for n in k.nodes if isinstance(n.body, Reduction)]


def _lowered(fn, *args, split: bool):
    kg = lower(make_fx(fn)(*args), split_reductions=split)
    verify(kg)
    return kg


CASES = {
    "sum over dim 0": (lambda x: x.sum(0), (torch.randn(4096, 96),)),
    "bias gradient of a product, 3-d": (lambda x, y: (x * y).sum((0, 1)), (torch.randn(16, 512, 40),
                                                                           torch.randn(16, 512, 40))),
    "whole-tensor sum": (lambda x: x.sum(), (torch.randn(1 << 19),)),
    "max over dim 0, keepdim": (lambda x: x.amax(0, keepdim=True), (torch.randn(8192, 40),)),
    "min over the last dim of two long rows": (lambda x: x.amin(-1), (torch.randn(2, 1 << 18),)),
    "prod near 1": (lambda x: (1 + x * 1e-4).prod(0), (torch.randn(8192, 48),)),
    "int64 sum": (lambda x: (x * 100).long().sum(0), (torch.randn(8192, 64),)),
    "bfloat16 sum: float32 partials": (lambda x: x.bfloat16().sum(0), (torch.randn(8192, 64),)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_split_reductions_match_eager_and_split(name):
    fn, args = CASES[name]
    whole, split = _lowered(fn, *args, split=False), _lowered(fn, *args, split=True)
    assert len(_reductions(split)) == len(_reductions(whole)) + 1
    partials = [n for n in _reductions(split) if n.spec.size != _reductions(whole)[0].spec.size]
    assert partials and all(n.spec.dtype != torch.bfloat16 for n in partials), "partials stay float32"
    want = fn(*args)
    low = want.dtype == torch.bfloat16
    torch.testing.assert_close(split(*args), want, rtol=1e-2 if low else 1e-4, atol=1e-1 if low else 1e-3)


def test_reductions_with_enough_outputs_or_no_exact_chunk_stay_whole():
    for fn, args in [(lambda x: x.sum(-1), (torch.randn(2048, 512),)),  # 2048 rows: enough programs
                     (lambda x: x.sum(0), (torch.randn(4099, 100),)),  # 4099 is prime: no exact chunk
                     (lambda x: x.sum(0), (torch.randn(64, 64),)),  # small
                     (lambda x: x.argmax(0), (torch.randn(8192, 64),))]:  # arg reductions do not split
        assert len(_reductions(_lowered(fn, *args, split=True))) == 1


def test_split_factor():
    assert split_factor(768, (4096,), reduces_last_dim=False) == 8  # a BERT bias gradient: 512-long chunks
    assert split_factor(1, (1 << 26,), reduces_last_dim=True) == 1024
    assert split_factor(4096, (16384,), reduces_last_dim=True) == 1  # 4096 rows keep a GPU busy
    assert split_factor(1000, (3, 100000), reduces_last_dim=False) == 3  # the first dim's divisors only
