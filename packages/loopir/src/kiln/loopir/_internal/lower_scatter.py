"""Lowerings of scatters as indirect stores (issue 20): scatter (src and value), scatter_add,
scatter.reduce, scatter_reduce (sum, prod, mean, amax, amin; include_self or not), index_reduce,
index_put and put (accumulate or not); and masked_scatter, a gather at a cumulative count.

Each is a `Scatter` node: its buffer starts as a copy of the destination (`base`, a realized
buffer), then a loop over the source elements stores or combines each at an index computed
with `ops.indirect_indexing` (negative indices wrap; an index outside raises IndexError, as
for loads). The modes follow eager's CPU kernels:

* include_self=False first stores the mode's identity at every index hit (eager's
  ``self.scatter_(dim, index, identity)``), then reduces into that;
* mean is a sum and a count (a second scatter of ones into ones or zeros, in the output's
  dtype, as eager counts), divided where the count is not 0 (integers: floor division);
* non-accumulating stores with duplicate indices keep one of the values (eager leaves which
  undefined); codegens that run the loop in order keep the last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from .ir import BufferSpec, ComputedBuffer, Scan, Scatter
from .lower import LoweringError, node_location
from .lower_indexing import unwrapped_indirect
from .lower_pointwise import broadcast_load, constant, out_dtype_size
from .registry import Lowerings
from .sizes import Expr, FloorDiv, compute_dtype, contiguous_strides, flat_index, numel
from .values import Lazy, StridedView

aten = torch.ops.aten
TABLE = Lowerings()

# (ops, source position) -> (value in the compute dtype, destination index per dim)
Element = Callable[[Any, tuple[Expr, ...]], tuple[Any, tuple[Expr, ...]]]

_REDUCE_MODES = {"sum": "sum", "add": "sum", "prod": "prod", "multiply": "prod", "amax": "max", "amin": "min",
                 "mean": "sum"}


def _base_buffer(ctx: Any, x: Any, dtype: torch.dtype, size: tuple[Expr, ...], like: Any) -> StridedView:
    """`x` as a buffer a scatter may start from: a buffer this graph computed, read whole, as
    it is; anything else (a graph input, a view, a lazy value) copied into a new one."""
    if isinstance(x, StridedView) and x.dtype == dtype and x.offset == 0:
        step = next((s for s in ctx.steps if s.name == x.buffer), None)
        if isinstance(step, ComputedBuffer) and tuple(step.spec.size) == tuple(x.size) \
                and tuple(step.spec.stride) == tuple(x.stride):
            return x
    computed = compute_dtype(dtype)

    def copy(ops: Any, index: tuple[Expr, ...]) -> Any:
        return broadcast_load(ops, x, index, computed)

    return ctx.realize(Lazy(dtype, size, copy, (), computed if computed != dtype else None), like)


def _positions(rindex: Sequence[Expr], size: Sequence[Expr]) -> tuple[Expr, ...]:
    """The source position of flat element `rindex[0]` of a row-major tensor of `size`."""
    (flat,) = rindex
    position: list[Expr] = []
    inner = sympy.Integer(1)
    for extent in reversed(size):
        if extent == 1:
            position.append(sympy.Integer(0))
            continue
        quotient = FloorDiv(flat, inner) if inner != 1 else flat
        position.append(sympy.Mod(quotient, extent) if inner * extent != numel(size) else quotient)
        inner = inner * extent
    return tuple(reversed(position))


def scatter_node(ctx: Any, node: Any, base: StridedView, source_size: tuple[Expr, ...], element: Element,
             mode: str) -> StridedView:
    """A `Scatter` node: a copy of `base` receiving `element` of each source position."""
    if numel(source_size) == 0:
        return base
    dtype = base.dtype

    def inner(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        value, dest = element(ops, _positions(rindex, source_size))
        return value, flat_index(dest, base.stride)

    spec = BufferSpec(ctx.new_buffer_name(), dtype, tuple(base.size), tuple(base.stride))
    body = Scatter((), (numel(source_size),), mode, inner, compute_dtype(dtype), scan_dim=0, mode=mode,
                   base=base.buffer)
    ctx.steps.append(ComputedBuffer(spec, body, (node.name,)))
    return StridedView(spec.name, dtype, spec.size, spec.stride)


def _check_index_dtype(node: Any, *indices: Any) -> None:
    for index in indices:
        if index is not None and index.dtype not in (torch.int64, torch.int32):
            raise LoweringError(f"a {index.dtype} index is not lowered (a boolean mask selects a data-dependent "
                                f"number of elements): {node_location(node)}")


def _identity(mode: str, dtype: torch.dtype) -> Any:
    """The element a reduction of `mode` starts from (include_self=False)."""
    if mode in ("sum", "mean"):
        return 0
    if mode == "prod":
        return 1
    largest = mode == "amax"
    if dtype == torch.bool:
        return not largest
    if dtype.is_floating_point:
        return -float("inf") if largest else float("inf")
    info = torch.iinfo(dtype)
    return info.min if largest else info.max


# -- scatter along a dim --------------------------------------------------------------------

def _along_dim(x: Any, dim: int, index: Any, src: Any, dtype: torch.dtype) -> Element:
    """scatter's element at position p of `index`: `src` at p (or the number `src`), stored at p
    with dim `dim` replaced by ``index[p]`` (a negative index is an error, as in eager)."""
    computed = compute_dtype(dtype)

    def element(ops: Any, position: tuple[Expr, ...]) -> tuple[Any, tuple[Expr, ...]]:
        value = broadcast_load(ops, src, position, computed) if isinstance(src, (StridedView, Lazy)) \
            else constant(ops, src, computed)
        if not x.size:  # 0-d: the index must be 0
            unwrapped_indirect(ops, index, position, sympy.Integer(1))
            return value, ()
        d = dim % len(x.size)
        where = unwrapped_indirect(ops, index, position, x.size[d])
        return value, tuple(where if k == d else p for k, p in enumerate(position))

    return element


def _scatter_dim(ctx: Any, node: Any, x: Any, dim: int, index: Any, src: Any, reduce: str | None,
                 include_self: bool = True) -> Any:
    _check_index_dtype(node, index)
    return _reduce_into(ctx, node, x, tuple(index.size), lambda value: _along_dim(x, dim, index, value,
                                                                                 node.meta["val"].dtype),
                        src, reduce, include_self)


def _reduce_into(ctx: Any, node: Any, x: Any, source_size: tuple[Expr, ...], element_of: Callable[[Any], Element],
                 src: Any, reduce: str | None, include_self: bool) -> Any:
    """`x` with `element_of(src)` of each source position stored (reduce None) or reduced in
    (`reduce`, eager's name: sum/add, prod/multiply, mean, amax, amin)."""
    dtype, size = out_dtype_size(node)
    like = node.meta.get("val")
    base = _base_buffer(ctx, x, dtype, size, like)
    if reduce is None:
        return scatter_node(ctx, node, base, source_size, element_of(src), "store")
    if reduce not in _REDUCE_MODES:
        raise LoweringError(f"reduce={reduce!r} is not lowered: {node_location(node)}")
    if not include_self:
        base = scatter_node(ctx, node, base, source_size, element_of(_identity(reduce, dtype)), "store")
    total = scatter_node(ctx, node, base, source_size, element_of(src), _REDUCE_MODES[reduce])
    if reduce != "mean":
        return total
    computed = compute_dtype(dtype)
    start = Lazy(dtype, size, lambda ops, i: constant(ops, int(include_self), computed), (node.name,),
                 computed if computed != dtype else None)
    counts = scatter_node(ctx, node, ctx.realize(start, like), source_size, element_of(1), "sum")
    return mean_by_count(node, total, counts, dtype, size)


def mean_by_count(node: Any, total: StridedView, counts: StridedView, dtype: torch.dtype, size: tuple[Expr, ...]) -> Lazy:
    """total / count, a count of 0 taken as 1 (eager's `count.masked_fill_(count == 0, 1)`)."""
    computed = compute_dtype(dtype)

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        count = broadcast_load(ops, counts, index, computed)
        zero = ops.eq(count, constant(ops, 0, computed))
        count = ops.where(zero, constant(ops, 1, computed), count)
        value = broadcast_load(ops, total, index, computed)
        return ops.truediv(value, count) if dtype.is_floating_point else ops.floordiv(value, count)

    return Lazy(dtype, size, inner, (node.name,), computed if computed != dtype else None)


@TABLE.register("reduction", aten.index_reduce.default)
def lower_index_reduce(ctx, node, x, dim, index, source, reduce, *, include_self=True):
    """Like scatter_reduce along `dim`, the destination of source position p being p with
    ``p[dim]`` replaced by ``index[p[dim]]`` (negative indices are errors, as in eager)."""
    _check_index_dtype(node, index)
    dtype = node.meta["val"].dtype

    def element_of(src: Any) -> Element:
        computed = compute_dtype(dtype)

        def element(ops: Any, position: tuple[Expr, ...]) -> tuple[Any, tuple[Expr, ...]]:
            value = broadcast_load(ops, src, position, computed) if isinstance(src, (StridedView, Lazy)) \
                else constant(ops, src, computed)
            if not x.size:
                unwrapped_indirect(ops, index, position[:1], sympy.Integer(1))
                return value, ()
            d = dim % len(x.size)
            where = unwrapped_indirect(ops, index, (position[d],), x.size[d])
            return value, tuple(where if k == d else p for k, p in enumerate(position))

        return element

    return _reduce_into(ctx, node, x, tuple(source.size), element_of, source, reduce, include_self)


@TABLE.register("reduction", aten.put.default)
def lower_put(ctx, node, x, index, source, accumulate=False):
    """put: `index` holds flat positions in `x`'s logical (row-major) order, negative ones
    counted from the end; `source` gives the values in its own row-major order."""
    _check_index_dtype(node, index)
    dtype, size = out_dtype_size(node)
    computed = compute_dtype(dtype)
    count = numel(index.size)

    def element(ops: Any, position: tuple[Expr, ...]) -> tuple[Any, tuple[Expr, ...]]:
        (flat,) = position
        value = broadcast_load(ops, source, _positions((flat,), source.size), computed)
        loaded = broadcast_load(ops, index, _positions((flat,), index.size), index.dtype)
        where = ops.indirect_indexing(loaded, numel(size))
        return value, _positions((where,), size) if size else ()

    base = _base_buffer(ctx, x, dtype, size, node.meta.get("val"))
    return scatter_node(ctx, node, base, (count,), element, "sum" if accumulate else "store")


@TABLE.register("reduction", aten.scatter.src, aten.scatter.value)
def lower_scatter(ctx, node, x, dim, index, src):
    return _scatter_dim(ctx, node, x, dim, index, src, None)


@TABLE.register("reduction", aten.scatter.reduce, aten.scatter.value_reduce)
def lower_scatter_reduce_legacy(ctx, node, x, dim, index, src, *, reduce):
    return _scatter_dim(ctx, node, x, dim, index, src, reduce)


@TABLE.register("reduction", aten.scatter_add.default)
def lower_scatter_add(ctx, node, x, dim, index, src):
    return _scatter_dim(ctx, node, x, dim, index, src, "sum")


@TABLE.register("reduction", aten.scatter_reduce.two)
def lower_scatter_reduce(ctx, node, x, dim, index, src, reduce, *, include_self=True):
    return _scatter_dim(ctx, node, x, dim, index, src, reduce, include_self)


# -- index_put --------------------------------------------------------------------------------

def _index_put_layout(x: Any, indices: Sequence[Any]) -> tuple[tuple[Expr, ...], Callable[..., Any]]:
    """The shape ``x[indices]`` has (what the values broadcast to), and a function giving the
    destination in `x` of a position of it (numpy's rule: the broadcast index dims replace the
    indexed dims in place when those are adjacent, and come first otherwise)."""
    indexed = [k for k, t in enumerate(indices) if t is not None]
    batch_size = tuple(_broadcast_sizes([indices[k].size for k in indexed]))
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    first = indexed[0] if adjacent else 0
    kept = [k for k in range(len(x.size)) if k not in indexed]
    kept_sizes = [x.size[k] for k in kept]
    size = (*kept_sizes[:first], *batch_size, *kept_sizes[first:]) if adjacent else (*batch_size, *kept_sizes)
    rank = len(batch_size)

    def destination(ops: Any, position: tuple[Expr, ...]) -> tuple[Expr, ...]:
        batch = position[first:first + rank]
        rest = list(position[:first] + position[first + rank:])
        dest: list[Any] = [None] * len(x.size)
        for k in indexed:
            loaded = broadcast_load(ops, indices[k], batch, indices[k].dtype)
            dest[k] = ops.indirect_indexing(loaded, x.size[k])
        for k in kept:
            dest[k] = rest.pop(0)
        return tuple(dest)

    return tuple(size), destination


def _broadcast_sizes(sizes: Sequence[Sequence[Expr]]) -> list[Expr]:
    rank = max(len(s) for s in sizes)
    out: list[Expr] = []
    for pos in range(rank):
        extents = [s[len(s) - rank + pos] for s in sizes if len(s) - rank + pos >= 0]
        varying = [e for e in extents if e != 1]
        out.append(varying[0] if varying else sympy.Integer(1))
    return out


@TABLE.register("reduction", aten.index_put.default)
def lower_index_put(ctx, node, x, indices, values, accumulate=False):
    _check_index_dtype(node, *indices)
    dtype, size = out_dtype_size(node)
    if not any(t is not None for t in indices):
        raise LoweringError(f"index_put without an index tensor is not lowered: {node_location(node)}")
    source_size, destination = _index_put_layout(x, indices)
    computed = compute_dtype(dtype)

    def element(ops: Any, position: tuple[Expr, ...]) -> tuple[Any, tuple[Expr, ...]]:
        return broadcast_load(ops, values, position, computed), destination(ops, position)

    base = _base_buffer(ctx, x, dtype, size, node.meta.get("val"))
    return scatter_node(ctx, node, base, source_size, element, "sum" if accumulate else "store")


@TABLE.register("reduction", aten.masked_scatter.default)
def lower_masked_scatter(ctx, node, x, mask, source):
    """masked_scatter as a gather: the k-th True of `mask` (broadcast to `x`, in row-major order)
    takes `source`'s k-th element, k counted by a cumulative sum (a `Scan`) of the mask. A
    source with fewer elements than the mask has Trues raises IndexError (eager: RuntimeError)."""
    dtype, size = out_dtype_size(node)
    computed = compute_dtype(dtype)
    total = numel(size)

    def mask_at(ops: Any, position: tuple[Expr, ...]) -> Any:
        return broadcast_load(ops, mask, position, torch.bool)

    def counted(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        return ops.to_dtype(mask_at(ops, _positions(rindex, size)), torch.int64)

    counts = ctx.add_reduction(Scan((), (total,), "sum", counted, torch.int64, scan_dim=0), (total,), node.name)
    strides = contiguous_strides(size)

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        chosen = mask_at(ops, index)
        before = ops.sub(counts.load(ops, (flat_index(index, strides),)), ops.constant(1, torch.int64))
        k = ops.indirect_indexing(ops.where(chosen, before, ops.constant(0, torch.int64)), numel(source.size))
        taken = broadcast_load(ops, source, _positions((k,), source.size), computed)
        return ops.where(chosen, taken, broadcast_load(ops, x, index, computed))

    return Lazy(dtype, size, inner, (node.name,), computed if computed != dtype else None)
