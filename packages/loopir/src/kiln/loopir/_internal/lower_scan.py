"""Lowerings of cumulative ops (cumsum, cumprod, logcumsumexp, cummax/cummin values) as `Scan`
nodes: a loop along the scanned dim per point of the other dims, storing the running value
at every step (issue 20).

The scanned value is the input converted to the output's dtype (eager's `dtype=` argument, or
int64 for integer and bool inputs of cumsum/cumprod), combined in its compute dtype: float32
for bfloat16/float16, rounded once per stored element. Producers fuse into the scan's loop
body (their Lazy bodies are inlined); the scan itself runs in a kernel of its own.
"""

from __future__ import annotations

from typing import Any

import torch

from .ir import Scan
from .lower import LoweringError, node_location
from .lower_pointwise import out_dtype_size
from .registry import Lowerings
from .sizes import Expr, compute_dtype, to_exprs
from .values import Lazy

aten = torch.ops.aten
TABLE = Lowerings()


def _scan(ctx: Any, node: Any, x: Any, dim: int, scan_type: str) -> Any:
    dtype, size = out_dtype_size(node)
    rank = len(size)
    if rank == 0:  # a 0-d scan is its one element
        return _converted(node, x, dtype)
    if not -rank <= dim < rank:
        raise LoweringError(f"dim {dim} is out of range for a {rank}-d tensor: {node_location(node)}")
    dim %= rank
    computed = compute_dtype(dtype)
    loaded = x.value_dtype if isinstance(x, Lazy) else x.dtype

    def inner(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        value = x.load(ops, (*index[:dim], *rindex, *index[dim:]))
        return value if loaded == computed else ops.to_dtype(value, computed)

    outer = (*size[:dim], *size[dim + 1:])
    body = Scan(outer, (size[dim],), scan_type, inner, computed, scan_dim=dim)
    return ctx.add_reduction(body, size, node.name, dtype, node.meta.get("val"))


def _converted(node: Any, x: Any, dtype: torch.dtype) -> Lazy:
    computed = compute_dtype(dtype)
    loaded = x.value_dtype if isinstance(x, Lazy) else x.dtype

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        value = x.load(ops, index)
        return value if loaded == computed else ops.to_dtype(value, computed)

    return Lazy(dtype, (), inner, (node.name,), computed if computed != dtype else None)


@TABLE.register("reduction", aten.cumsum.default)
def lower_cumsum(ctx, node, x, dim, *, dtype=None):
    return _scan(ctx, node, x, dim, "sum")


@TABLE.register("reduction", aten.cumprod.default)
def lower_cumprod(ctx, node, x, dim, *, dtype=None):
    return _scan(ctx, node, x, dim, "prod")


@TABLE.register("reduction", aten.logcumsumexp.default)
def lower_logcumsumexp(ctx, node, x, dim):
    return _scan(ctx, node, x, dim, "logaddexp")


@TABLE.register("reduction", aten.cummax.default, aten.cummin.default)
def lower_cummax(ctx, node, x, dim):
    """(values, indices): two scans of `x`, the running max/min and the position of its latest
    occurrence (NaN: the latest NaN), as eager's cummax/cummin."""
    values_val, indices_val = node.meta["val"]
    rank = len(values_val.shape)
    if rank == 0:
        return x, _zero_index(node)
    if not -rank <= dim < rank:
        raise LoweringError(f"dim {dim} is out of range for a {rank}-d tensor: {node_location(node)}")
    dim %= rank
    size = tuple(to_exprs(values_val.shape))
    largest = node.target is aten.cummax.default
    computed = compute_dtype(values_val.dtype)
    loaded = x.value_dtype if isinstance(x, Lazy) else x.dtype

    def value_at(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        value = x.load(ops, (*index[:dim], *rindex, *index[dim:]))
        return value if loaded == computed else ops.to_dtype(value, computed)

    def pair(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        return value_at(ops, index, rindex), ops.index_expr(rindex[0], torch.int64)

    outer = (*size[:dim], *size[dim + 1:])
    like_values, like_indices = node.meta["val"]
    values = ctx.add_reduction(Scan(outer, (size[dim],), "max" if largest else "min", value_at, computed,
                                    scan_dim=dim), size, node.name, values_val.dtype, like_values)
    indices = ctx.add_reduction(Scan(outer, (size[dim],), "argmax" if largest else "argmin", pair, computed,
                                     scan_dim=dim), size, node.name, torch.int64, like_indices)
    return values, indices


def _zero_index(node: Any) -> Lazy:
    return Lazy(torch.int64, (), lambda ops, index: ops.constant(0, torch.int64), (node.name,))
