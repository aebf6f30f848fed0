"""Size symbols a region's inputs give only inside expressions: a region given the diagonal of
an (s0, s1) matrix has an input of size Min(s0, s1) and stride s1 + 1, and no input of size s0
or s1 (fuzz seeds 21xxxxxx-23xxxxxx: diagonal, then roll or group_norm, under dynamic shapes), and
one given a `[..., ::2]` slice has size (s1 + 1)//2."""

from __future__ import annotations

import pytest
import torch
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import LoweringError, lower, verify


def _region(fn, *outer_values):
    """`fn` traced at the fake values `outer_values` of a symbolically traced outer graph."""
    outer = make_fx(lambda a: outer_values and tuple(v(a) for v in outer_values), tracing_mode="symbolic")(
        torch.randn(3, 4))
    values = [arg.meta["val"] for arg in next(n for n in outer.graph.nodes if n.op == "output").args[0]]
    with detect_fake_mode(values):
        return make_fx(fn, tracing_mode="real")(*values)


def test_a_diagonal_view_gives_its_matrix_width_through_its_stride():
    kg = lower(_region(lambda d: torch.cat([d[1:], d[:1]]) * 2, lambda a: a.diagonal()))
    verify(kg)
    assert "sym_stride" in kg.gm.code
    for rows, columns in ((3, 4), (6, 2), (5, 5)):
        d = torch.randn(rows, columns).diagonal()
        torch.testing.assert_close(kg(d), torch.roll(d * 2, -1, 0))


def test_symbols_used_only_inside_a_min_take_its_value():
    """A contiguous diagonal: Min(s0, s1) is all the region knows; passing its value for both s0
    and s1 keeps every size the kernels compute."""
    kg = lower(_region(lambda d: (d - d.mean()).cumsum(0), lambda a: a.diagonal().contiguous()))
    verify(kg)
    for rows, columns in ((3, 4), (6, 2), (5, 5)):
        d = torch.randn(rows, columns).diagonal().contiguous()
        torch.testing.assert_close(kg(d), (d - d.mean()).cumsum(0))


def test_a_symbol_known_only_inside_a_floor_division_takes_a_value_keeping_it():
    """A contiguous `[:, ::2]` slice: its width (s1 + 1)//2 is all the region knows of s1; it
    passes 2*m - 1 for s1 (m the width), which keeps (s1 + 1)//2."""
    kg = lower(_region(lambda d: d - d.mean(-1, keepdim=True), lambda a: a[:, ::2].contiguous()))
    verify(kg)
    for rows, columns in ((3, 4), (2, 7), (5, 2)):
        d = torch.randn(rows, columns)[:, ::2].contiguous()
        torch.testing.assert_close(kg(d), d - d.mean(-1, keepdim=True))


def test_a_symbol_also_needed_outside_its_min_is_an_error():
    region = _region(lambda d, c: d.sum() + c.sum(), lambda a: a.diagonal().contiguous(),
                     lambda a: torch.cat([a[:, 0], a[0, :]]))
    with pytest.raises(LoweringError, match=r"size symbol s\d+ is not a size or stride of any graph input"):
        lower(region)
