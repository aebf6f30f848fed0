"""Lowerings of reductions (sum, amax, amin, mean): each becomes a realized `Reduction` buffer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from .ir import Reduction
from .lower_pointwise import broadcast_load, pointwise
from .registry import Lowerings
from .sizes import Expr, numel, to_exprs

aten = torch.ops.aten
TABLE = Lowerings()


def _reduced_dims(rank: int, dims: Sequence[int] | int | None) -> tuple[int, ...]:
    """Normalized reduced dims; none given means all. A 0-d tensor accepts dim 0 or -1 and
    has nothing to reduce over."""
    if dims is None or (not isinstance(dims, int) and len(dims) == 0) or rank == 0:
        return tuple(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(sorted({d % rank for d in dims}))


def reduce(ctx, node, value, dims, keepdim: bool, reduction_type: str) -> Any:
    """Realize a `Reduction` of `value` over `dims`; returns the result's StridedView."""
    out = node.meta["val"]
    dtype = out.dtype
    in_size = value.size
    reduced = _reduced_dims(len(in_size), dims)
    kept = [d for d in range(len(in_size)) if d not in reduced]

    def inner(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        full = [sympy.Integer(0)] * len(in_size)
        for pos, d in enumerate(reduced):
            full[d] = rindex[pos]
        for pos, d in enumerate(kept):
            full[d] = index[d] if keepdim else index[pos]
        return broadcast_load(ops, value, tuple(full), dtype)

    reduction = Reduction(to_exprs(out.shape), tuple(in_size[d] for d in reduced), reduction_type,
                          inner, dtype)
    return ctx.add_reduction(reduction, to_exprs(out.shape), node.name)


@TABLE.register("reduction", aten.sum.dim_IntList)
def lower_sum(ctx, node, x, dims=None, keepdim=False, *, dtype=None):
    return reduce(ctx, node, x, dims, keepdim, "sum")


@TABLE.register("reduction", aten.sum.default)
def lower_sum_all(ctx, node, x, *, dtype=None):
    return reduce(ctx, node, x, None, False, "sum")


@TABLE.register("reduction", aten.amax.default)
def lower_amax(ctx, node, x, dims=(), keepdim=False):
    return reduce(ctx, node, x, dims, keepdim, "max")


@TABLE.register("reduction", aten.amin.default)
def lower_amin(ctx, node, x, dims=(), keepdim=False):
    return reduce(ctx, node, x, dims, keepdim, "min")


@TABLE.register("reduction", aten.mean.dim)
def lower_mean(ctx, node, x, dims=None, keepdim=False, *, dtype=None):
    total = reduce(ctx, node, x, dims, keepdim, "sum")
    count = numel([x.size[d] for d in _reduced_dims(len(x.size), dims)])
    return pointwise(node, lambda ops, s, n: ops.truediv(s, n), total, count)


@TABLE.register("reduction", aten.mean.default)
def lower_mean_all(ctx, node, x, *, dtype=None):
    return lower_mean(ctx, node, x, None, False)
