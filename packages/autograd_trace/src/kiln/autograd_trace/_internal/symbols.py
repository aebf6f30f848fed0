"""Turning symbolic sizes recorded at trace time into ints for the inputs of one call.

With dynamic shapes the view of an input that an output is (size, stride, storage offset)
is known as sympy expressions over the input sizes. At run time each plain symbol is bound by
matching the traced fake inputs against the real ones, and the expressions are evaluated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import sympy
import torch

log = logging.getLogger(__name__)

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def has_symbols(values: Sequence[object]) -> bool:
    return any(isinstance(v, _SYMBOLIC) for v in values)


def bind_symbols(
    traced: Sequence[object], actual: Sequence[object]
) -> dict[sympy.Symbol, sympy.Integer]:
    """Symbol -> value, from every traced size, stride, offset or scalar that is a plain symbol.

    Values are sympy Integers, not ints: ``xreplace`` puts a replacement in as it is, so a size
    that is a bare symbol would come back as a Python int rather than a sympy expression.
    """
    bindings: dict[sympy.Symbol, sympy.Integer] = {}
    for fake, real in zip(traced, actual, strict=True):
        if isinstance(fake, torch.Tensor) and isinstance(real, torch.Tensor):
            pairs = [
                *zip(fake.shape, real.shape),
                *zip(fake.stride(), real.stride()),
                (fake.storage_offset(), real.storage_offset()),
            ]
        else:
            pairs = [(fake, real)]
        for symbolic, concrete in pairs:
            if isinstance(symbolic, _SYMBOLIC):
                expr = symbolic.node.expr
                if isinstance(expr, sympy.Symbol):
                    bindings[expr] = sympy.Integer(int(concrete))
    return bindings


def evaluate(value: object, bindings: dict[sympy.Symbol, sympy.Integer]) -> int:
    """The int a traced size takes under ``bindings``; raises if a symbol stays unbound."""
    if not isinstance(value, _SYMBOLIC):
        return int(value)
    result = value.node.expr.xreplace(bindings)
    if result.free_symbols:
        raise RuntimeError(
            f"kiln.autograd_trace: cannot evaluate the size {value.node.expr} for this call: "
            f"{sorted(map(str, result.free_symbols))} are not sizes of any input"
        )
    return int(result)
