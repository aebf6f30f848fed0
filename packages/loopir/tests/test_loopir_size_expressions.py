"""Size expressions the kernel graph's wrapper computes at run time from its inputs' sizes."""

from __future__ import annotations

import types

import pytest
import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.functions import CeilToInt, FloorToInt, IntTrueDiv

from kiln.loopir._internal.kernel_graph import _Builder


@pytest.mark.parametrize("rounding, expected", [(CeilToInt, [2, 4, 1]), (FloorToInt, [1, 3, 1])])
def test_rounded_true_divisions_are_computed(rounding, expected):
    """torch writes an attention's logsumexp size padded to a multiple of 32 (the memory-efficient
    kernel, dynamic shapes) as CeilToInt(IntTrueDiv(s, 32)): the wrapper computes it."""
    s = sympy.Symbol("s0", integer=True, positive=True)
    builder = _Builder(fx.GraphModule(torch.nn.Module(), fx.Graph()), types.SimpleNamespace(inputs=(), steps=()))
    builder.symbols[s] = builder.graph.placeholder("s0")
    builder.graph.output(builder.expr(rounding(IntTrueDiv(s, 32))))
    module = fx.GraphModule(torch.nn.Module(), builder.graph)
    assert [module(n) for n in (40, 100, 32)] == expected
