"""Turning symbolic sizes recorded at trace time into ints for the inputs of one call.

With dynamic shapes the view of an input that an output is (size, stride, storage offset)
is known as sympy expressions over the input sizes. At run time each plain symbol is bound by
matching the traced input layouts (``plan.TensorLayout``, or a scalar's expression) against
the real inputs, and the expressions are evaluated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sympy
import torch

from .plan import TensorLayout, is_symbolic

log = logging.getLogger(__name__)


def has_symbols(values: Sequence[object]) -> bool:
    return any(is_symbolic(v) for v in values)


def bind_symbols(
    traced: Sequence[object], actual: Sequence[object]
) -> dict[sympy.Symbol, sympy.Integer]:
    """Symbol -> value, from every traced size, stride, offset or scalar that is a plain symbol.

    Values are sympy Integers, not ints: ``xreplace`` puts a replacement in as it is, so a size
    that is a bare symbol would come back as a Python int rather than a sympy expression.
    """
    bindings: dict[sympy.Symbol, sympy.Integer] = {}
    for layout, real in zip(traced, actual, strict=True):
        if isinstance(layout, TensorLayout) and isinstance(real, torch.Tensor):
            pairs = [
                *zip(layout.shape, real.shape),
                *zip(layout.stride, real.stride()),
                (layout.storage_offset, real.storage_offset()),
            ]
        else:
            pairs = [(layout, real)]
        for symbolic, concrete in pairs:
            if isinstance(symbolic, sympy.Symbol):
                bindings[symbolic] = sympy.Integer(int(concrete))
    return bindings


def evaluate(value: object, bindings: dict[sympy.Symbol, sympy.Integer]) -> int:
    """The int a traced size takes under ``bindings``; raises if a symbol stays unbound."""
    if not isinstance(value, sympy.Expr):
        return int(value)
    result = value.xreplace(bindings)
    if result.free_symbols:
        raise RuntimeError(
            f"kiln.autograd_trace: cannot evaluate the size {value} for this call: "
            f"{sorted(map(str, result.free_symbols))} are not sizes of any input"
        )
    return int(result)
