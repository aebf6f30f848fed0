"""Row loops cut to fit a regrouped consumer (`row_cuts.py`): a group norm's normalization, over
`(N, C, H, W)`, runs in its statistics' kernel (rows `(N, G)` x `C/G * H * W`), with the row loop
cut where its per-channel weight divides it; scans ask eager's layout for their split direction."""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import FloorDiv, Reduction, Scan, lower, verify
from kiln.loopir._internal.ir import Welford, merged_index
from kiln.loopir._internal.sizes import index_vars


def _lowered(fn, *args, **options):
    kg = lower(make_fx(fn)(*args), **options)
    verify(kg)
    return kg


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_merged_index_cuts_a_loop_dim_only_with_split():
    (i0, i1), (r0,) = index_vars(2), index_vars(1, "r")
    loops = (8, 4, 2048)
    assert merged_index((8, 32, 16, 16), loops, (i0, i1, r0)) is None
    assert merged_index((8, 32, 16, 16), loops, (i0, i1, r0), split=True) == (
        i0, 8 * i1 + FloorDiv(r0, 256), sympy.Mod(FloorDiv(r0, 16), 16), sympy.Mod(r0, 16))
    assert merged_index((8, 24, 16, 16), loops, (i0, i1, r0), split=True) is None  # 24 is not 4 x a digit of 2048
    v = index_vars(4)
    assert merged_index((8, 4, 2048), (8, 4, 8, 256)) == (v[0], v[1], 256 * v[2] + v[3])


def _normalized(x, dims):
    """The statistics and normalization of decomp's layer/group/batch norms."""
    mean = x.mean(dims, keepdim=True)
    deviation = x - mean
    var = (deviation * deviation).mean(dims, keepdim=True)
    return deviation * torch.rsqrt(var + 1e-5)


def _group_norm(x, w, b):
    """A group norm as decomp writes it: the statistics over (N, G) rows of a view, the affine
    map per channel of the (N, C, H, W) result."""
    n, c = x.shape[:2]
    out = _normalized(x.reshape(n, 4, -1), -1).view(x.shape)
    return out * w.view(1, c, 1, 1) + b.view(1, c, 1, 1)


def _group_norm_plain(x):
    return _normalized(x.view(x.shape[0], 8, -1), -1).view(x.shape)


@pytest.mark.parametrize("fn, args", [
    (_group_norm, (_x(4, 32, 8, 8), _x(32, seed=1), _x(32, seed=2))),
    (_group_norm_plain, (_x(2, 16, 6, 10),)),
], ids=["affine", "no_affine"])
def test_group_norm_is_one_kernel_with_its_row_loop_cut(fn, args):
    kg = _lowered(fn, *args)
    assert len(kg.kernels) == 1, str(kg)
    kernel = kg.kernels[0]
    if fn is _group_norm:  # the weight divides the row at each channel: cut there
        assert list(kernel.row_ranges) == [32 // 4, 8 * 8], str(kg)
    reductions = [n for n in kernel.nodes if isinstance(n.body, Reduction)]
    assert all(list(n.reduction_ranges) == list(kernel.row_ranges) for n in reductions), str(kg)
    for node in kernel.nodes:  # no load, store or index value divides a row variable
        rw = kernel.accesses(node)
        for expr in [a.index for a in rw.accesses] + rw.index_exprs:
            for sub in sympy.preorder_traversal(sympy.sympify(expr)):
                if isinstance(sub, (FloorDiv, sympy.Mod)):
                    assert not any(s.name.startswith("r") for s in sub.free_symbols), f"{node.name}: {expr}"
    torch.testing.assert_close(kg(*args), fn(*args), rtol=1e-5, atol=1e-5)


def test_a_channels_last_group_norm_matches_eager_values_and_strides():
    """(decomp's group norm on a channels-last input keeps two kernels: integration's
    test_integration_group_norm.py; this hand-written one reshapes into a copy first)."""
    x, w, b = _x(2, 16, 5, 6).to(memory_format=torch.channels_last), _x(16, seed=1), _x(16, seed=2)
    kg = _lowered(_group_norm, x, w, b)
    got, want = kg(x, w, b), _group_norm(x, w, b)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.stride() == want.stride()


def test_a_consumer_whose_cuts_do_not_nest_stays_apart():
    """Rows of 12 seen as [4, 3] with a per-3 weight, then read as [2, 6] (cuts at 3 and at 6
    do not nest): not fused, eager's values."""
    def fn(x, w):
        centred = x - x.mean(-1, keepdim=True)
        return (centred.view(2, 4, 3) * w[:3].view(1, 1, 3)).view(2, 2, 6) * w.view(1, 1, 6)

    x, w = _x(2, 12), _x(6, seed=1)
    kg = _lowered(fn, x, w)
    torch.testing.assert_close(kg(x, w), fn(x, w))


def _softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("name, fn, args, kernels", [
    ("layer_norm", lambda x, w, b: _normalized(x, -1) * w + b, (_x(16, 64), _x(64, seed=1), _x(64, seed=2)), 1),
    ("layer_norm_2d", lambda x: _normalized(x, (-2, -1)), (_x(4, 5, 6, 8),), 1),
    ("softmax", _softmax, (_x(16, 64),), 1),
    ("instance_norm", lambda x, w: _normalized(x, (2, 3)) * w.view(1, -1, 1, 1), (_x(2, 8, 5, 5), _x(8, seed=1)), 1),
])
def test_other_norms_keep_their_kernel_counts(name, fn, args, kernels):
    kg = _lowered(fn, *args)
    assert len(kg.kernels) == kernels, str(kg)
    torch.testing.assert_close(kg(*args), fn(*args), rtol=1e-5, atol=1e-5)


def _chunk_scan(kg):
    """The reduction range of the first (chunk) scan of a split scan."""
    scans = [n for k in kg.kernels for n in k.nodes if isinstance(n.body, Scan)]
    return int(scans[0].reduction_ranges[0])


@pytest.mark.parametrize("op", ["cumsum", "cummax"])
def test_a_scan_along_the_contiguous_dim_of_a_transposed_value_splits_as_a_row_scan(op):
    """`x.t().cumsum(0)` scans the dim its elements are contiguous along: eager's layout says so,
    not the logical last dim, so it splits as a scan of rows (one program per row: fewer
    chunks) and matches eager, values and strides."""
    def scan(x):
        value = getattr(x.t(), op)(0)
        return value[0] if op == "cummax" else value

    x = _x(64, 16384)
    kg = _lowered(scan, x, split_reductions=True)
    as_rows = _lowered(lambda x: getattr(x, op)(1)[0] if op == "cummax" else x.cumsum(1), x, split_reductions=True)
    assert _chunk_scan(kg) == _chunk_scan(as_rows) == 16384 // 16, str(kg)
    got, want = kg(x), scan(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
    assert got.stride() == want.stride()


def test_a_group_norm_with_welford_and_row_temporaries_stays_one_kernel():
    """The options codegen_triton lowers with, and `welford` (its statistics in one pass): the
    cut reductions still pair up (same values at the same place), one kernel, eager's values."""
    args = (_x(4, 32, 8, 8), _x(32, seed=1), _x(32, seed=2))
    kg = _lowered(_group_norm, *args, welford=True, row_temporaries=True, recompute_cheap=True)
    assert len(kg.kernels) == 1, str(kg)
    assert any(isinstance(n.body, Welford) for n in kg.kernels[0].nodes), str(kg)
    torch.testing.assert_close(kg(*args), _group_norm(*args), rtol=1e-5, atol=1e-5)
