"""Graph outputs that eager returns as views: which node they view, and their geometry.

`(x + 1).t()`, `(x * 2)[:, 1:]`, `y.unsqueeze(0).expand(2, ...)` or `y.diagonal()` returned from
a graph are, in eager, views of a computed tensor: strides of 0, gaps or an offset that no
freshly allocated buffer has. The lowering (`lower._lower_outputs`) computes the viewed tensor
(the base) in its eager layout and returns a `StridedView` of it with the output's eager sizes,
strides and storage offset (Inductor's `ReinterpretView` outputs do the same), so a compiled
output has eager's strides and shares storage with other outputs as eager's does.

Meta keys read: ``meta["val"]`` (FakeTensors whose geometry is eager's).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import sympy
import torch
import torch.fx as fx

from .sizes import Expr, to_expr, to_exprs


def view_base(node: fx.Node) -> fx.Node | None:
    """The node whose result `node` views through a chain of ATen view ops (`t`, `slice`,
    `expand`, `diagonal`, `getitem` of `split`, ...), or None when `node` is no view."""
    current = node
    while (source := _viewed(current)) is not None:
        current = source
    return None if current is node else current


def _viewed(node: fx.Node) -> fx.Node | None:
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if node.target is operator.getitem:  # one view of a multi-view op (split, unbind, chunk)
        producer = node.args[0]
        return producer if _is_view_op(producer.target) else None
    return node.args[0] if _is_view_op(node.target) else None


def _is_view_op(target: Any) -> bool:
    """Whether `target`'s result aliases its first argument without writing it (its schema's
    alias annotation: ``Tensor(a) self -> Tensor(a)``)."""
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.returns or not schema.arguments:
        return False
    returned, argument = schema.returns[0].alias_info, schema.arguments[0].alias_info
    return (returned is not None and argument is not None and not returned.is_write and not argument.is_write
            and bool(set(returned.before_set) & set(argument.before_set)))


def views_like(view: torch.Tensor, base: torch.Tensor) -> bool:
    """Whether the FakeTensor `view`'s storage offset counts from `base`'s storage: it aliases
    `base`, or it views a storage of `base`'s size (an equal value's fake: the decomp stage
    merges equal nodes and keeps each one's fake). make_fx's real tracing mode records a view
    of an offset as a tensor of its own, with a smaller storage and offset 0: refused."""
    if torch._C._is_alias_of(view, base):
        return True
    return str(view.untyped_storage().nbytes()) == str(base.untyped_storage().nbytes())


def _text(values: Iterable[Any]) -> list[str]:
    """Sizes, strides or offsets as text: SymInts compared without adding shape guards."""
    return [str(v) for v in values]


def view_geometry(view: torch.Tensor, base: torch.Tensor) -> tuple[tuple[Expr, ...], tuple[Expr, ...], Expr]:
    """(sizes, strides, offset from `base`'s first element) of the eager tensor `view` of `base`."""
    offset = to_expr(view.storage_offset()) - to_expr(base.storage_offset())
    return to_exprs(view.shape), to_exprs(view.stride()), offset


def free_symbols(exprs: Iterable[Expr]) -> set[sympy.Symbol]:
    found: set[sympy.Symbol] = set()
    for expr in exprs:
        found |= sympy.sympify(expr).free_symbols
    return found


def overlaps(size: Iterable[Any], stride: Iterable[Any]) -> bool:
    """Whether a view of `size` and `stride` (ints, sympy expressions or FX nodes of symbolic
    sizes) reads an element twice: a stride of 0 along a dim longer than 1 (an expand). eager
    refuses in-place ops on such a view (internal overlap)."""
    return any(isinstance(st, (int, sympy.Integer)) and st == 0 and not (isinstance(n, (int, sympy.Integer)) and n <= 1)
               for n, st in zip(size, stride))
