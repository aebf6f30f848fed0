"""Lowerings of reductions (sum, prod, amax/max, amin/min, mean, any, all, argmax, argmin): each
becomes a realized `Reduction` buffer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from .ir import Reduction
from .lower import LoweringError, node_location
from .lower_pointwise import broadcast_load, pointwise
from .lower_split import SPLIT_TYPES, reduces_contiguous_dim, split_factor, split_reduction
from .registry import Lowerings
from .sizes import Expr, compute_dtype, contiguous_strides, flat_index, numel, to_exprs

aten = torch.ops.aten
TABLE = Lowerings()
# any/all are max/min reductions that eager allows over an empty dim (False / True)
_NEUTRAL_ON_EMPTY = (aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim, aten.all.dims)


def _reduced_dims(rank: int, dims: Sequence[int] | int | None) -> tuple[int, ...]:
    """Normalized reduced dims; none given means all. A 0-d tensor accepts dim 0 or -1 and
    has nothing to reduce over."""
    if dims is None or (not isinstance(dims, int) and len(dims) == 0) or rank == 0:
        return tuple(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    return tuple(sorted({d % rank for d in dims}))


def reduce(ctx, node, value, dims, keepdim: bool, reduction_type: str, out: Any = None,
           store_dtype: torch.dtype | None = None) -> Any:
    """Realize a `Reduction` of `value` over `dims`; returns the result's StridedView. `out` is
    the result's FakeTensor (default: the node's meta["val"]); the buffer has `store_dtype`
    (default: out's). bfloat16/float16 values are loaded as float32 and accumulate in float32."""
    out = node.meta["val"] if out is None else out
    arg = reduction_type in ("argmax", "argmin")
    dtype = compute_dtype(value.dtype if arg else out.dtype)  # arg reductions compare the input's values
    in_size = value.size
    reduced = _reduced_dims(len(in_size), dims)
    kept = [d for d in range(len(in_size)) if d not in reduced]
    reduced_sizes = tuple(in_size[d] for d in reduced)
    if reduction_type in ("max", "min", "argmax", "argmin") and \
            any(sympy.sympify(s) == 0 for s in reduced_sizes) and node.target not in _NEUTRAL_ON_EMPTY:
        # eager raises IndexError ("Expected reduction dim to have non-zero size"): left to eager
        raise LoweringError(f"{node_location(node)} reduces over an empty dim, which eager refuses with an "
                            "IndexError; not lowered, so eager raises it")

    def inner(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        full = [sympy.Integer(0)] * len(in_size)
        for pos, d in enumerate(reduced):
            full[d] = rindex[pos]
        for pos, d in enumerate(kept):
            full[d] = index[d] if keepdim else index[pos]
        loaded = broadcast_load(ops, value, tuple(full), dtype)
        if not arg:
            return loaded
        # The position counts row-major over the reduced dims (the flat index of argmax(dim=None)).
        position = flat_index(rindex, contiguous_strides(reduced_sizes))
        return loaded, ops.index_expr(position, torch.int64)

    split = split_factor(numel(to_exprs(out.shape)), reduced_sizes, reduces_contiguous_dim(node, reduced, len(in_size)),
                         item_bytes=value.dtype.itemsize) if ctx.split_reductions and reduction_type in SPLIT_TYPES else 1
    if split > 1:
        return split_reduction(ctx, node.name, inner, to_exprs(out.shape), reduced_sizes, reduction_type, dtype,
                               split, store_dtype or out.dtype, out)
    reduction = Reduction(to_exprs(out.shape), reduced_sizes, reduction_type, inner, dtype)
    return ctx.add_reduction(reduction, to_exprs(out.shape), node.name, store_dtype or out.dtype, like=out)


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
    # a low-precision sum stays float32 until divided: one rounding, as eager's mean
    total = reduce(ctx, node, x, dims, keepdim, "sum", store_dtype=compute_dtype(node.meta["val"].dtype))
    count = numel([x.size[d] for d in _reduced_dims(len(x.size), dims)])
    return pointwise(node, lambda ops, s, n: ops.truediv(s, n), total, count)


@TABLE.register("reduction", aten.mean.default)
def lower_mean_all(ctx, node, x, *, dtype=None):
    return lower_mean(ctx, node, x, None, False)


@TABLE.register("reduction", aten.prod.dim_int)
def lower_prod(ctx, node, x, dim, keepdim=False, *, dtype=None):
    return reduce(ctx, node, x, dim, keepdim, "prod")


@TABLE.register("reduction", aten.prod.default)
def lower_prod_all(ctx, node, x, *, dtype=None):
    return reduce(ctx, node, x, None, False, "prod")


@TABLE.register("reduction", aten.max.default)
def lower_max_all(ctx, node, x):
    return reduce(ctx, node, x, None, False, "max")


@TABLE.register("reduction", aten.min.default)
def lower_min_all(ctx, node, x):
    return reduce(ctx, node, x, None, False, "min")


# any/all: the max/min of the values as bool (`reduce` loads them in the output's dtype).
@TABLE.register("reduction", aten.any.default, aten.any.dim, aten.any.dims)
def lower_any(ctx, node, x, dim=None, keepdim=False):
    return reduce(ctx, node, x, dim, keepdim, "max")


@TABLE.register("reduction", aten.all.default, aten.all.dim, aten.all.dims)
def lower_all(ctx, node, x, dim=None, keepdim=False):
    return reduce(ctx, node, x, dim, keepdim, "min")


@TABLE.register("reduction", aten.argmax.default)
def lower_argmax(ctx, node, x, dim=None, keepdim=False):
    return reduce(ctx, node, x, dim, keepdim, "argmax")


@TABLE.register("reduction", aten.argmin.default)
def lower_argmin(ctx, node, x, dim=None, keepdim=False):
    return reduce(ctx, node, x, dim, keepdim, "argmin")


@TABLE.register("reduction", aten.max.dim)
def lower_max_dim(ctx, node, x, dim, keepdim=False):
    values, indices = node.meta["val"]
    return (reduce(ctx, node, x, dim, keepdim, "max", values), reduce(ctx, node, x, dim, keepdim, "argmax", indices))


@TABLE.register("reduction", aten.min.dim)
def lower_min_dim(ctx, node, x, dim, keepdim=False):
    values, indices = node.meta["val"]
    return (reduce(ctx, node, x, dim, keepdim, "min", values), reduce(ctx, node, x, dim, keepdim, "argmin", indices))
