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

import sympy
import torch

from .ir import Scan
from .lower import LoweringError, node_location
from .lower_pointwise import out_dtype_size
from .lower_split import split_factor
from .registry import Lowerings
from .sizes import Expr, FloorDiv, compute_dtype, numel, to_exprs
from .values import Lazy

aten = torch.ops.aten
TABLE = Lowerings()
# With `split_reductions`: long scans over few rows (see _split_scan), with the pointwise combine
# of an element's chunk scan and the earlier chunks' prefix.
SPLIT_SCAN_TYPES = ("sum", "prod", "logaddexp")


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
    split = split_factor(numel(outer), (size[dim],), dim == rank - 1) \
        if ctx.split_reductions and scan_type in SPLIT_SCAN_TYPES else 1
    if split > 1:
        return _split_scan(ctx, node, inner, size, dim, scan_type, computed, split, dtype)
    body = Scan(outer, (size[dim],), scan_type, inner, computed, scan_dim=dim)
    return ctx.add_reduction(body, size, node.name, dtype, node.meta.get("val"))


def _split_scan(ctx: Any, node: Any, inner: Any, size: tuple[Expr, ...], dim: int, scan_type: str,
                computed: torch.dtype, split: int, dtype: torch.dtype) -> Any:
    """A long scan over few rows in three steps, each with `split` times the parallel work:

        local[.., s, r, ..]  = scan of chunk s up to r    (chunks of the scanned dim)
        prefix[.., s, ..]    = scan of local[.., s, last, ..] over s   (short)
        out[.., s*C + r, ..] = local[.., s, r, ..] combined with prefix[.., s - 1, ..]

    sum, prod and logaddexp split (their combine is pointwise: `_combine`); cummax/cummin,
    whose indices would need a pair combine, do not. The partial scans keep the compute dtype
    (float32 for bfloat16/float16)."""
    chunk = sympy.Integer(int(size[dim]) // split)
    before, after = size[:dim], size[dim + 1:]

    def chunk_fn(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        return inner(ops, (*index[:dim], *index[dim + 1:]), (index[dim] * chunk + rindex[0],))

    local_size = (*before, sympy.Integer(split), chunk, *after)
    local = ctx.add_reduction(Scan((*before, sympy.Integer(split), *after), (chunk,), scan_type, chunk_fn, computed,
                                   scan_dim=dim + 1), local_size, node.name, computed)

    def total_fn(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        return local.load(ops, (*index[:dim], rindex[0], chunk - 1, *index[dim:]))

    prefix = ctx.add_reduction(Scan((*before, *after), (sympy.Integer(split),), scan_type, total_fn, computed,
                                    scan_dim=dim), (*before, sympy.Integer(split), *after), node.name, computed)

    def out_fn(ops: Any, index: tuple[Expr, ...]) -> Any:
        position = index[dim]
        s, r = FloorDiv(position, chunk), sympy.Mod(position, chunk)
        own = local.load(ops, (*index[:dim], s, r, *index[dim + 1:]))
        earlier = prefix.load(ops, (*index[:dim], sympy.Max(s - 1, 0), *index[dim + 1:]))
        first = ops.eq(ops.index_expr(s, torch.int64), ops.constant(0, torch.int64))
        return ops.where(first, own, _combine(ops, scan_type, earlier, own))

    lazy = Lazy(dtype, size, out_fn, (node.name,), computed if computed != dtype else None)
    return ctx.realize(lazy, node.meta.get("val"))


def _combine(ops: Any, scan_type: str, a: Any, b: Any) -> Any:
    """`a` and `b` combined as the scan combines them."""
    if scan_type == "sum":
        return ops.add(a, b)
    if scan_type == "prod":
        return ops.mul(a, b)
    # logaddexp: the larger plus log1p(exp(-|a - b|)); an infinite larger one is the result
    # (both -inf, or +inf, where a - b is NaN); a NaN propagates through `maximum`.
    larger = ops.maximum(a, b)
    added = ops.add(larger, ops.log1p(ops.exp(ops.neg(ops.abs(ops.sub(a, b))))))
    return ops.where(ops.isinf(larger), larger, added)


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
