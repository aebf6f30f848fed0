"""`LowerOptions.split_reductions`: a long sum/prod/max/min into few outputs becomes partial
reductions over chunks of its first reduced dim, then a reduction of the partials;
long cumsum/cumprod/logcumsumexp/cummax/cummin over few rows become chunk scans, a scan of their
totals and a combine."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import Reduction, Scan, lower, verify
from kiln.loopir._internal.lower_split import split_digits, split_factor


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
    assert split_factor(768, (4096,), reduces_last_dim=False) == 32  # a BERT bias gradient: 128-row chunks
    assert split_factor(768, (8, 512), reduces_last_dim=False) == 32  # the same over [batch, sequence]
    assert split_factor(1, (1 << 26,), reduces_last_dim=True) == 1024
    assert split_factor(4096, (16384,), reduces_last_dim=True) == 1  # 4096 rows keep a GPU busy
    assert split_factor(1000, (3, 100000), reduces_last_dim=False) == 30  # 3 whole, then 10 parts of 100000
    assert split_factor(768, (8, 511), reduces_last_dim=False) == 8  # 511 = 7 x 73: no part of it fits, dim 0 alone
    assert split_factor(768, (4096,), reduces_last_dim=False, strided_chunk=512) == 8  # scans keep 512
    # programs that reduce little stay one kernel: an attention mask's `any` over 512 rows of
    # 4096 outputs (32 outputs x 512 rows a program), and 64 rows of 16384
    assert split_factor(4096, (512,), reduces_last_dim=False) == 1
    assert split_factor(64, (16384,), reduces_last_dim=True) == 1
    assert split_factor(64, (1 << 16,), reduces_last_dim=True) == 16


def test_split_programs_by_element_size():
    """Over outer dims, 4-byte (or wider) values aim at WIDE_STRIDED_TARGET_PROGRAMS: a float32
    layer norm's weight gradient over [32, 512] rows of 768 in 128 chunks (3072 programs of 32
    columns), its bfloat16 sums and unknown sizes at TARGET_PROGRAMS (32 chunks); reductions over
    the last dim keep TARGET_PROGRAMS whatever the size."""
    assert split_factor(768, (32, 512), reduces_last_dim=False, item_bytes=4) == 128
    assert split_factor(768, (32, 512), reduces_last_dim=False, item_bytes=8) == 128
    assert split_factor(768, (32, 512), reduces_last_dim=False, item_bytes=2) == 32
    assert split_factor(768, (32, 512), reduces_last_dim=False) == 32
    assert split_factor(3072, (4096,), reduces_last_dim=False, item_bytes=4) == 32
    assert split_factor(3072, (4096,), reduces_last_dim=False, item_bytes=2) == 8
    assert split_factor(768, (4096,), reduces_last_dim=False, item_bytes=4) == 32  # 128-row chunks either way
    assert split_factor(1, (1 << 26,), reduces_last_dim=True, item_bytes=4) == 1024


@pytest.mark.parametrize("dtype, chunks", [(torch.float32, 128), (torch.bfloat16, 32)])
def test_a_lowered_column_sum_splits_by_its_element_size(dtype, chunks):
    x = torch.randn(16384, 1024).to(dtype)
    partials, total = (n.body for n in _reductions(_lowered(lambda x: x.sum(0), x, split=True)))
    assert tuple(partials.ranges) == (chunks, 1024) and tuple(partials.reduction_ranges) == (16384 // chunks,)
    assert tuple(total.ranges) == (1024,) and tuple(total.reduction_ranges) == (chunks,)


def test_split_digits():
    assert split_digits([8, 512], 32) == (1, 4)  # dim 0 whole, dim 1 in 4 parts
    assert split_digits([8, 512], 8) == (0, 8)
    assert split_digits([2, 3, 512], 24) == (2, 4)
    assert split_digits([3, 5], 6) is None  # 2 does not divide 3, and 6 / 3 = 2 does not divide 5
    assert split_digits([3, 10], 6) == (1, 2)


def test_a_split_over_several_reduced_dims_matches_eager():
    """A layer norm's weight gradient over `[8, 512]` rows: 32 chunks, each the 8 of dim 0 whole
    times a quarter of dim 1; the same for `[2, 3, 512]` (24 chunks: dims 0 and 1 unflattened)."""
    for shape, split in (((8, 512, 96), 32), ((2, 3, 512, 96), 24)):
        x, y = torch.randn(shape), torch.randn(shape)

        def fn(x, y):
            dims = tuple(range(x.dim() - 1))
            return (x * y).sum(dims), x.amax(dims)

        kg = _lowered(fn, x, y, split=True)
        partials = [n for n in _reductions(kg) if n.spec.size[0] == split]
        assert len(partials) == 2 and all(list(n.reduction_ranges) == [128] for n in partials), partials
        torch.testing.assert_close(kg(x, y), fn(x, y), rtol=1e-4, atol=1e-3)


def test_channels_last_statistics_split_as_reductions_over_outer_dims():
    """A channels-last batch's sum over N, H, W reads runs of the contiguous channel dim: it
    splits as a reduction over outer dims (blocks of outputs per program), not as one over the
    logical last dim (W), which gave 16 chunks and 32 programs for a 64x64x56x56 batch (a
    batch norm's statistics on an H200: 35 us against Inductor's 19)."""
    x = torch.randn(64, 64, 56, 56).contiguous(memory_format=torch.channels_last)
    kg = _lowered(lambda t: t.sum((0, 2, 3)), x, split=True)
    partial = next(n for n in _reductions(kg) if len(n.spec.size) > 1)
    # float32: split 896 ways (WIDE_STRIDED_TARGET_PROGRAMS): the whole N dim times 14 parts of H
    # (chunks of 4 x 56 rows of channels)
    assert partial.spec.size[0] == 896
    torch.testing.assert_close(kg(x), x.sum((0, 2, 3)), rtol=1e-4, atol=1e-2)
    contiguous = _lowered(lambda t: t.sum((0, 2, 3)), x.contiguous(), split=True)
    assert next(n for n in _reductions(contiguous) if len(n.spec.size) > 1).spec.size[0] == 16


def _scans(kg):
    return [n for k in kg.kernels for n in k.nodes if isinstance(n.body, Scan)]


SCANS = {
    "cumsum of one long vector": (lambda x: torch.cumsum(x, 0), (torch.randn(1 << 19),)),
    "cumsum along the last dim of two long rows, float64": (lambda x: torch.cumsum(x, -1),
                                                            (torch.randn(2, 1 << 18, dtype=torch.float64),)),
    "int64 cumsum over dim 0 of two columns": (lambda x: torch.cumsum(x, 0), (torch.randint(-5, 5, (1 << 18, 2)),)),
    "cumprod near 1": (lambda x: torch.cumprod(1 + 1e-6 * x, 0), (torch.randn(1 << 18, dtype=torch.float64),)),
    "logcumsumexp with -inf and +inf": (lambda x: torch.logcumsumexp(x, 0), (torch.cat([
        torch.full((7,), float("-inf"), dtype=torch.float64), torch.randn(1 << 18, dtype=torch.float64) * 30,
        torch.tensor([float("inf")], dtype=torch.float64), torch.randn(1000 - 8, dtype=torch.float64)]),)),
    "bfloat16 cumsum: float32 partial scans": (lambda x: torch.cumsum(x, 1),
                                               (torch.randn(2, 1 << 18, dtype=torch.bfloat16),)),
}


@pytest.mark.parametrize("name", sorted(SCANS))
def test_long_scans_over_few_rows_split(name):
    """cumsum/cumprod/logcumsumexp: chunk scans, a scan of the chunks' last values, then a
    pointwise combine."""
    fn, args = SCANS[name]
    whole, split = _lowered(fn, *args, split=False), _lowered(fn, *args, split=True)
    assert len(_scans(whole)) == 1 and len(_scans(split)) == 2
    assert all(n.spec.dtype != torch.bfloat16 for n in _scans(split)), "partial scans stay float32"
    want = fn(*args)
    low = want.dtype == torch.bfloat16
    # bfloat16: eager rounds the float32 running sum to bf16 per element, as kiln does
    torch.testing.assert_close(split(*args), want, rtol=1e-2 if low else 1e-5, atol=4.0 if low else 1e-3)


def test_short_or_many_row_scans_stay_whole():
    for fn, args in [(lambda x: torch.cumsum(x, -1), (torch.randn(2048, 512),)),  # enough rows
                     (lambda x: torch.cumsum(x, 0), (torch.randn(4099),)),  # small
                     (lambda x: torch.cummax(x, -1)[1], (torch.randn(2048, 512),))]:
        # one scan per output: cumsum's one, cummax's values and indices
        assert len(_scans(_lowered(fn, *args, split=True))) == len(_scans(_lowered(fn, *args, split=False)))


def _ties_and_nans(n: int, dtype: torch.dtype) -> torch.Tensor:
    """Few distinct values (many ties), -inf runs, and NaNs in a middle chunk and near the end."""
    x = torch.randint(-3, 4, (n,)).to(dtype)
    x[: n // 64] = float("-inf")
    x[n // 3], x[n - 100] = float("nan"), float("nan")
    return x


CUMMAX = {
    "cummax with ties, -inf and NaN": (lambda x: torch.cummax(x, 0), _ties_and_nans(1 << 19, torch.float32)),
    "cummin with ties, +inf and NaN": (lambda x: torch.cummin(x, 0), -_ties_and_nans(1 << 19, torch.float32)),
    "cummax over dim 0 of two int32 columns": (lambda x: torch.cummax(x, 0),
                                                torch.randint(-3, 4, (1 << 18, 2), dtype=torch.int32)),
    "cummin along the last dim of two bfloat16 rows": (lambda x: torch.cummin(x, -1),
                                                       _ties_and_nans(1 << 19, torch.bfloat16).view(2, -1)),
    "cummax of bools: int64 positions": (lambda x: torch.cummax(x, -1), torch.rand(2, 1 << 18) < 0.01),
    "cummin of a fused product": (lambda x: torch.cummin(x * 2 + 1, 0), _ties_and_nans(1 << 19, torch.float64)),
}


@pytest.mark.parametrize("name", sorted(CUMMAX))
def test_long_cummax_cummin_split_as_pairs(name):
    """cummax/cummin: chunk scans of values and positions, the same scans of the chunks' last
    pairs, then a pair combine keeping eager's latest-of-equal-values and latest-NaN rule."""
    fn, x = CUMMAX[name]
    whole, split = _lowered(fn, x, split=False), _lowered(fn, x, split=True)
    assert len(_scans(whole)) == 2 and len(_scans(split)) == 4
    assert {n.spec.dtype for n in _scans(split) if n.body.reduction_type.startswith("arg")} == {torch.int64}
    want_values, want_indices = fn(x)
    got_values, got_indices = split(x)
    torch.testing.assert_close(got_values, want_values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(got_indices, want_indices)
