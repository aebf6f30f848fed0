"""Lowerings of cumulative ops (cumsum, cumprod, logcumsumexp, cummax/cummin values) as `Scan`
nodes: a loop along the scanned dim per point of the other dims, storing the running value
at every step (issue 20).

The scanned value is the input converted to the output's dtype (eager's `dtype=` argument, or
int64 for integer and bool inputs of cumsum/cumprod), combined in its compute dtype: float32
for bfloat16/float16, rounded once per stored element. Producers fuse into the scan's loop
body (their Lazy bodies are inlined); the scan itself runs in a kernel of its own. With the
`split_reductions` lowering option, a long scan over few rows runs as chunk scans, a scan of the
chunks' totals and a pointwise combine (`_split_scan`; cummax/cummin: `_split_cummax`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from .ir import Scan
from .lower import LoweringError, node_location
from .lower_pointwise import out_dtype_size
from .lower_split import MIN_CHUNK, reduces_contiguous_dim, split_factor
from .registry import Lowerings
from .sizes import Expr, FloorDiv, compute_dtype, numel, to_exprs
from .values import Lazy

aten = torch.ops.aten
TABLE = Lowerings()
# With `split_reductions`: long scans over few rows (see _split_scan), with the pointwise combine
# of an element's chunk scan and the earlier chunks' prefix (cummax/cummin: `_split_cummax`).
SPLIT_SCAN_TYPES = ("sum", "prod", "logaddexp")


def _split_count(node: Any, outer: tuple[Expr, ...], length: Expr, dim: int, rank: int) -> int:
    """Into how many chunks a scan of `length` over `outer` rows splits (`lower_split.split_factor`
    with 512-element chunks whatever the direction, and no per-program minimum: each chunk of a
    split scan is a pass of its own)."""
    return split_factor(numel(outer), (length,), reduces_contiguous_dim(node, (dim,), rank),
                        strided_chunk=MIN_CHUNK, program_elements=0)


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
    splits = ctx.split_reductions and scan_type in SPLIT_SCAN_TYPES
    split = _split_count(node, outer, size[dim], dim, rank) if splits else 1
    if split > 1:
        return _split_scan(ctx, node, inner, size, dim, scan_type, computed, split, dtype)
    body = Scan(outer, (size[dim],), scan_type, inner, computed, scan_dim=dim)
    return ctx.add_reduction(body, size, node.name, dtype, node.meta.get("val"))


@dataclasses.dataclass(frozen=True)
class _Chunks:
    """The scanned dim `dim` of `size` cut into `split` chunks of `chunk` elements, for the
    partial scans of a split scan (see `_split_scan`), realized by `ctx` for node `origin`."""

    ctx: Any
    origin: str
    size: tuple[Expr, ...]
    dim: int
    split: int

    @property
    def chunk(self) -> Expr:
        return sympy.Integer(int(self.size[self.dim]) // self.split)

    def scan_chunks(self, scan_type: str, element: Any, dtype: torch.dtype) -> Any:
        """local[.., s, r, ..]: the scan of `element` (the unsplit scan's element function, so
        positions stay those of the whole row) over chunk s up to r, combined in `dtype`."""
        dim, chunk, count = self.dim, self.chunk, sympy.Integer(self.split)

        def chunk_fn(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
            return element(ops, (*index[:dim], *index[dim + 1:]), (index[dim] * chunk + rindex[0],))

        before, after = self.size[:dim], self.size[dim + 1:]
        scan = Scan((*before, count, *after), (chunk,), scan_type, chunk_fn, dtype, scan_dim=dim + 1)
        return self.ctx.add_reduction(scan, (*before, count, chunk, *after), self.origin, _stored(scan_type, dtype))

    def scan_totals(self, scan_type: str, total: Any, dtype: torch.dtype) -> Any:
        """prefix[.., s, ..]: the scan over s of `total(ops, at)`, a load at `at`, the place
        of chunk s's last element in the chunk scans' buffers."""
        dim, count = self.dim, sympy.Integer(self.split)

        def total_fn(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
            return total(ops, (*index[:dim], rindex[0], self.chunk - 1, *index[dim:]))

        before, after = self.size[:dim], self.size[dim + 1:]
        scan = Scan((*before, *after), (count,), scan_type, total_fn, dtype, scan_dim=dim)
        return self.ctx.add_reduction(scan, (*before, count, *after), self.origin, _stored(scan_type, dtype))

    def places(self, ops: Any, index: tuple[Expr, ...]) -> tuple[tuple[Expr, ...], tuple[Expr, ...], Any]:
        """Where output element `index` reads its chunk scan (local), the scan of the earlier
        chunks' totals (prefix), and whether its chunk is the first (with no earlier ones)."""
        dim, chunk = self.dim, self.chunk
        s, r = FloorDiv(index[dim], chunk), sympy.Mod(index[dim], chunk)
        own = (*index[:dim], s, r, *index[dim + 1:])
        earlier = (*index[:dim], sympy.Max(s - 1, 0), *index[dim + 1:])
        return own, earlier, ops.eq(ops.index_expr(s, torch.int64), ops.constant(0, torch.int64))


def _stored(scan_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a partial scan combined in `dtype` is stored in: int64 positions for argmax/argmin."""
    return torch.int64 if scan_type in ("argmax", "argmin") else dtype


def _split_scan(ctx: Any, node: Any, inner: Any, size: tuple[Expr, ...], dim: int, scan_type: str,
                computed: torch.dtype, split: int, dtype: torch.dtype) -> Any:
    """A long scan over few rows in three steps, each with `split` times the parallel work:

        local[.., s, r, ..]  = scan of chunk s up to r    (chunks of the scanned dim)
        prefix[.., s, ..]    = scan of local[.., s, last, ..] over s   (short)
        out[.., s*C + r, ..] = local[.., s, r, ..] combined with prefix[.., s - 1, ..]

    sum, prod and logaddexp combine pointwise (`_combine`); cummax/cummin combine (value,
    position) pairs (`_split_cummax`). The partial scans keep the compute dtype (float32 for
    bfloat16/float16)."""
    chunks = _Chunks(ctx, node.name, size, dim, split)
    local = chunks.scan_chunks(scan_type, inner, computed)
    prefix = chunks.scan_totals(scan_type, local.load, computed)

    def out_fn(ops: Any, index: tuple[Expr, ...]) -> Any:
        own_at, earlier_at, first = chunks.places(ops, index)
        own = local.load(ops, own_at)
        return ops.where(first, own, _combine(ops, scan_type, prefix.load(ops, earlier_at), own))

    lazy = Lazy(dtype, size, out_fn, (node.name,), computed if computed != dtype else None)
    return ctx.realize(lazy, node.meta.get("val"))


def _split_cummax(ctx: Any, node: Any, pair: Any, size: tuple[Expr, ...], dim: int, largest: bool,
                  computed: torch.dtype, split: int) -> tuple[Any, Any]:
    """cummax/cummin as a split scan (see `_split_scan`) of (value, position) pairs: chunk
    scans of the values and of their positions (whole-row positions), the same two scans over
    the chunks' last pairs, then per element the chunk's pair where it wins over the earlier
    chunks' pair: where it is NaN or as large (cummax; as small: cummin), as eager keeps the
    latest of equal values and the latest NaN."""
    kind = "max" if largest else "min"
    chunks = _Chunks(ctx, node.name, size, dim, split)
    local_values = chunks.scan_chunks(kind, lambda ops, index, rindex: pair(ops, index, rindex)[0], computed)
    local_positions = chunks.scan_chunks(f"arg{kind}", pair, computed)
    prefix_values = chunks.scan_totals(kind, local_values.load, computed)
    prefix_positions = chunks.scan_totals(
        f"arg{kind}", lambda ops, at: (local_values.load(ops, at), local_positions.load(ops, at)), computed)

    def picked(local: Any, prefix: Any) -> Any:
        def out_fn(ops: Any, index: tuple[Expr, ...]) -> Any:
            own_at, earlier_at, first = chunks.places(ops, index)
            own_value, earlier_value = local_values.load(ops, own_at), prefix_values.load(ops, earlier_at)
            wins = ops.ge(own_value, earlier_value) if largest else ops.le(own_value, earlier_value)
            own_kept = ops.logical_or(first, ops.logical_or(ops.ne(own_value, own_value), wins))
            return ops.where(own_kept, local.load(ops, own_at), prefix.load(ops, earlier_at))
        return out_fn

    values_val, indices_val = node.meta["val"]
    dtype = values_val.dtype
    values = Lazy(dtype, size, picked(local_values, prefix_values), (node.name,),
                  computed if computed != dtype else None)
    indices = Lazy(torch.int64, size, picked(local_positions, prefix_positions), (node.name,))
    return ctx.realize(values, values_val), ctx.realize(indices, indices_val)


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
    split = _split_count(node, outer, size[dim], dim, rank) if ctx.split_reductions else 1
    if split > 1:
        return _split_cummax(ctx, node, pair, size, dim, largest, computed, split)
    like_values, like_indices = node.meta["val"]
    values = ctx.add_reduction(Scan(outer, (size[dim],), "max" if largest else "min", value_at, computed,
                                    scan_dim=dim), size, node.name, values_val.dtype, like_values)
    indices = ctx.add_reduction(Scan(outer, (size[dim],), "argmax" if largest else "argmin", pair, computed,
                                     scan_dim=dim), size, node.name, torch.int64, like_indices)
    return values, indices


def _zero_index(node: Any) -> Lazy:
    return Lazy(torch.int64, (), lambda ops, index: ops.constant(0, torch.int64), (node.name,))
