"""Lowerings of indexing and creation ops: cat, padding, flip, arange, gathers and functional
scatters into a view.

Each is a `Lazy` value whose body picks, per output element, where to read:

* Several sources (cat, pad, slice_scatter, ...) become nested `ops.where` selections on
  index predicates. Every source is loaded at an index clamped into its bounds (`Min`/`Max`
  in the index expression), so the loads of the branches not taken stay in bounds too.
* Data-dependent reads (index_select, index.Tensor, gather) load the index tensor, turn the
  value into an index with `ops.indirect_indexing` (checked against the dim's size; negative
  indices wrap for index.Tensor and are errors for gather and index_select, as in eager), and
  load the source at it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from .lower_pointwise import broadcast_load, constant, out_dtype_size
from .lower_views import _slice_start, diagonal_dims, runtime_index
from .registry import Lowerings
from .sizes import Expr, FloorDiv, contiguous_strides, same_exprs, to_expr
from .values import Lazy, StridedView

aten = torch.ops.aten
TABLE = Lowerings()
I64 = torch.int64


def _clamp(expr: Expr, size: Expr) -> Expr:
    """`expr` clamped into `[0, size - 1]`: an in-bounds index for a load whose result may be
    discarded by a `where`."""
    return sympy.Min(sympy.Max(expr, 0), size - 1)


def _replace(index: Sequence[Expr], dim: int, value: Expr) -> tuple[Expr, ...]:
    return tuple(value if k == dim else i for k, i in enumerate(index))


def _in_range(ops: Any, expr: Expr, low: Expr | None, high: Expr | None) -> Any:
    """The bool value `low <= expr < high` (a bound of None is not checked)."""
    value = ops.index_expr(expr, I64)
    conds = []
    if low is not None:
        conds.append(ops.ge(value, ops.index_expr(low, I64)))
    if high is not None:
        conds.append(ops.lt(value, ops.index_expr(high, I64)))
    result = conds[0]
    for cond in conds[1:]:
        result = ops.logical_and(result, cond)
    return result


def _load_as(ops: Any, value: Any, index: Sequence[Expr], dtype: torch.dtype) -> Any:
    loaded = value.load(ops, index)
    have = value.value_dtype if isinstance(value, Lazy) else value.dtype
    return loaded if have == dtype else ops.to_dtype(loaded, dtype)


@TABLE.register("pointwise", aten.cat.default)
def lower_cat(ctx, node, tensors, dim=0):
    dtype, size = out_dtype_size(node)
    dim = dim % len(size)
    # Legacy: 1-d empty tensors may be concatenated with anything; empty parts add nothing.
    parts = [t for t in tensors if len(t.size) == len(size) and t.size[dim] != 0]
    if not parts:
        return Lazy(dtype, size, lambda ops, index: constant(ops, 0, dtype), (node.name,))
    if len(parts) == 1 and _passes_through(ctx, node, parts[0], dtype, size):
        return parts[0]
    starts = [sympy.Integer(0)]
    for part in parts[:-1]:
        starts.append(starts[-1] + part.size[dim])

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        result = None
        for part, start in reversed(list(zip(parts, starts))):
            local = _clamp(index[dim] - start, part.size[dim])
            value = _load_as(ops, part, _replace(index, dim, local), dtype)
            if result is None:
                result = value
            else:
                end = start + part.size[dim]
                result = ops.where(_in_range(ops, index[dim], None, end), value, result)
        return result

    return Lazy(dtype, size, inner, (node.name,))


def _passes_through(ctx: Any, node: Any, part: Any, dtype: torch.dtype, size: Sequence[Expr]) -> bool:
    """Whether a cat of one non-empty part (Hugging Face's key/value cache appends each step's
    keys to an empty tensor) may read that part where it lies instead of copying it: a value a
    step of this graph stored (not a graph input, whose memory eager's cat would not share), of
    the cat's dtype and sizes, and the cat no output of the graph (its strides are then seen by
    nothing; Inductor drops such a cat too)."""
    return (_stored_here(ctx, part, dtype) and same_exprs(part.size, size)
            and not any(user.op == "output" for user in node.users))


def _stored_here(ctx: Any, value: Any, dtype: torch.dtype) -> bool:
    """Whether `value` is a view of `dtype` of a buffer a step of this graph stored (not a graph
    input, whose memory eager's fresh result would not share)."""
    from .lower import step_names  # lower imports the lowering tables
    return (isinstance(value, StridedView) and value.dtype == dtype
            and any(value.buffer in step_names(step) for step in ctx.steps))


@TABLE.register("pointwise", aten.constant_pad_nd.default)
def lower_constant_pad_nd(ctx, node, x, pad, value=0):
    dtype, size = out_dtype_size(node)
    rank = len(size)
    # pad lists (before, after) pairs from the last dim backwards; negative amounts crop.
    before = {rank - 1 - k: to_expr(pad[2 * k]) for k in range(len(pad) // 2)}
    after = {rank - 1 - k: to_expr(pad[2 * k + 1]) for k in range(len(pad) // 2)}

    def may_pad(amount: Expr) -> bool:
        return not (amount.is_number and amount <= 0)

    if not any(may_pad(a) for a in (*before.values(), *after.values())):
        cropped = _cropped_view(ctx, node, x, dtype, size, before)
        if cropped is not None:
            return cropped

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        if any(s == 0 for s in x.size):
            return constant(ops, value, dtype)
        source, conds = list(index), []
        for d, lo in before.items():
            source[d] = index[d] - lo
            if may_pad(lo) or may_pad(after[d]):
                conds.append(_in_range(ops, source[d], 0 if may_pad(lo) else None,
                                       x.size[d] if may_pad(after[d]) else None))
                source[d] = _clamp(source[d], x.size[d])
        loaded = _load_as(ops, x, source, dtype)
        if not conds:
            return loaded
        inside = conds[0]
        for cond in conds[1:]:
            inside = ops.logical_and(inside, cond)
        return ops.where(inside, loaded, constant(ops, value, dtype))

    return Lazy(dtype, size, inner, (node.name,))


def _cropped_view(ctx: Any, node: Any, x: Any, dtype: torch.dtype, size: Sequence[Expr],
                  before: dict[int, Expr]) -> StridedView | None:
    """A pad that only crops (every amount <= 0: the backward of a padded weight, whose
    gradient is the padded matmul's cut back to the weight's rows), read where `x` lies instead of
    copied: a view of a buffer a step of this graph stored (an input's memory is never shared, as
    eager's pad returns new memory), and, where the graph returns it, laid out as eager's
    contiguous result is."""
    if not _stored_here(ctx, x, dtype):
        return None
    offset = x.offset + sum((-lo) * x.stride[d] for d, lo in before.items())
    view = StridedView(x.buffer, dtype, tuple(size), tuple(x.stride), offset)
    if any(user.op == "output" for user in node.users) and not same_exprs(view.stride, contiguous_strides(size)):
        return None
    return view


@TABLE.register("view", aten.flip.default)
def lower_flip(ctx, node, x, dims):
    # An index function, not a negative stride: strided views must stay valid for as_strided.
    rank = len(x.size)
    flipped = {d % rank for d in dims} if rank else set()

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        return x.load(ops, tuple(x.size[k] - 1 - i if k in flipped else i for k, i in enumerate(index)))

    origins, computed = (x.origins, x.computed) if isinstance(x, Lazy) else ((), None)
    return Lazy(x.dtype, tuple(x.size), inner, origins + (node.name,), computed)


@TABLE.register("constant", aten.arange.start_step)
def lower_arange(ctx, node, start, end=None, step=1, **kwargs):
    dtype, size = out_dtype_size(node)
    exact = all(isinstance(v, int) or (isinstance(v, sympy.Expr) and v.is_integer) for v in (start, step))

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        (i,) = index
        if exact and not dtype.is_floating_point:
            return ops.index_expr(to_expr(start) + i * to_expr(step), dtype)
        # start + i * step computed in double, then cast (as eager does on CPU).
        position = ops.mul(ops.index_expr(i, torch.float64), constant(ops, step, torch.float64))
        value = ops.add(position, constant(ops, start, torch.float64))
        return value if dtype == torch.float64 else ops.to_dtype(value, dtype)

    return Lazy(dtype, size, inner, (node.name,))


@TABLE.register("constant", aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default)
def lower_empty(ctx, node, *args, **kwargs):
    # Uninitialized memory has no specified value: zeros are one. Outputs are contiguous.
    dtype, size = out_dtype_size(node)
    return Lazy(dtype, size, lambda ops, index: constant(ops, 0, dtype), (node.name,))


def _indirect(ops: Any, index_value: Any, position: Sequence[Expr], size: Expr) -> sympy.Symbol:
    """The index `index_value` holds at `position` (broadcast), as an indirect index into a dim of `size`."""
    return ops.indirect_indexing(broadcast_load(ops, index_value, position, index_value.dtype), size)


def unwrapped_indirect(ops: Any, index_value: Any, position: Sequence[Expr], size: Expr) -> sympy.Symbol:
    """As `_indirect`, for ops whose negative indices are errors, not counted from the end
    (gather, index_select, scatter): a negative index becomes `size`, which the range check
    of `indirect_indexing` reports as an IndexError."""
    loaded = broadcast_load(ops, index_value, position, index_value.dtype)
    negative = ops.lt(loaded, ops.constant(0, index_value.dtype))
    return ops.indirect_indexing(ops.where(negative, ops.index_expr(size, index_value.dtype), loaded), size)


def _check_index_dtype(node, *indices: Any) -> None:
    for index in indices:
        if index is not None and index.dtype not in (torch.int64, torch.int32):
            raise NotImplementedError(f"{node.target} with a {index.dtype} index is not lowered (boolean masks "
                                      "select a data-dependent number of elements)")


@TABLE.register("pointwise", aten.index_select.default)
def lower_index_select(ctx, node, x, dim, index):
    _check_index_dtype(node, index)
    dtype, size = out_dtype_size(node)
    dim = dim % len(size) if size else 0

    def inner(ops: Any, out_index: tuple[Expr, ...]) -> Any:
        if not x.size:  # 0-d source: the index must be 0 (or -1)
            return x.load(ops, ())
        position = (out_index[dim],) if index.size else ()
        return x.load(ops, _replace(out_index, dim, unwrapped_indirect(ops, index, position, x.size[dim])))

    return Lazy(dtype, size, inner, (node.name,))


@TABLE.register("pointwise", aten.gather.default)
def lower_gather(ctx, node, x, dim, index, *, sparse_grad=False):
    _check_index_dtype(node, index)
    dtype, size = out_dtype_size(node)

    def inner(ops: Any, out_index: tuple[Expr, ...]) -> Any:
        if not x.size:
            return x.load(ops, ())
        d = dim % len(x.size)
        return x.load(ops, _replace(out_index, d, unwrapped_indirect(ops, index, out_index, x.size[d])))

    return Lazy(dtype, size, inner, (node.name,))


@TABLE.register("pointwise", aten.index.Tensor)
def lower_index(ctx, node, x, indices):
    """Advanced indexing: the index tensors broadcast together; their dims replace the indexed
    dims in place when those are adjacent, and come first otherwise (numpy's rule)."""
    _check_index_dtype(node, *indices)
    dtype, size = out_dtype_size(node)
    indexed = [k for k, t in enumerate(indices) if t is not None]
    ranks = [len(indices[k].size) for k in indexed]
    batch_rank = max(ranks)
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    first = indexed[0] if adjacent else 0
    kept = [k for k in range(len(x.size)) if k not in indexed]

    def inner(ops: Any, out_index: tuple[Expr, ...]) -> Any:
        batch = out_index[first:first + batch_rank]
        rest = list(out_index[:first] + out_index[first + batch_rank:])
        source: list[Any] = [None] * len(x.size)
        for k in indexed:
            source[k] = _indirect(ops, indices[k], batch, x.size[k])
        for k in kept:
            source[k] = rest.pop(0)
        return x.load(ops, tuple(source))

    return Lazy(dtype, size, inner, (node.name,))


@TABLE.register("pointwise", aten.slice_scatter.default)
def lower_slice_scatter(ctx, node, x, src, dim=0, start=None, end=None, step=1):
    dtype, size = out_dtype_size(node)
    dim = dim % len(size)
    length = src.size[dim]
    begin = _slice_start(start, size[dim], length)

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        old = _load_as(ops, x, index, dtype)
        if length == 0:
            return old
        offset = index[dim] - begin
        inside = _in_range(ops, offset, 0, length * step)
        if step != 1:
            on_step = ops.eq(ops.index_expr(sympy.Mod(sympy.Max(offset, 0), step), I64), ops.index_expr(0, I64))
            inside = ops.logical_and(inside, on_step)
        position = _clamp(FloorDiv(sympy.Max(offset, 0), step), length)
        new = _load_as(ops, src, _replace(index, dim, position), dtype)
        return ops.where(inside, new, old)

    return Lazy(dtype, size, inner, (node.name,))


@TABLE.register("pointwise", aten.select_scatter.default)
def lower_select_scatter(ctx, node, x, src, dim, index):
    dtype, size = out_dtype_size(node)
    dim = dim % len(size)
    chosen = to_expr(index)
    if chosen.is_number and chosen < 0:
        chosen = chosen + size[dim]

    def inner(ops: Any, out_index: tuple[Expr, ...]) -> Any:
        new = _load_as(ops, src, out_index[:dim] + out_index[dim + 1:], dtype)
        # a symbolic index may be negative at run time: wrapped, and checked, as eager does
        at = chosen if chosen.is_number else runtime_index(ops, chosen, size[dim])
        hit = ops.eq(ops.index_expr(out_index[dim], I64), ops.index_expr(at, I64))
        return ops.where(hit, new, _load_as(ops, x, out_index, dtype))

    return Lazy(dtype, size, inner, (node.name,))


@TABLE.register("pointwise", aten.diagonal_scatter.default)
def lower_diagonal_scatter(ctx, node, x, src, offset=0, dim1=0, dim2=1):
    dtype, size = out_dtype_size(node)
    kept, dim1, dim2, row, col = diagonal_dims(len(size), offset, dim1, dim2)
    length = src.size[-1]

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        old = _load_as(ops, x, index, dtype)
        if length == 0:
            return old
        position = index[dim1] - row
        on_diagonal = ops.logical_and(
            ops.eq(ops.index_expr(index[dim2] - index[dim1], I64), ops.index_expr(col - row, I64)),
            _in_range(ops, position, 0, length))
        new = _load_as(ops, src, tuple(index[d] for d in kept) + (_clamp(position, length),), dtype)
        return ops.where(on_diagonal, new, old)

    return Lazy(dtype, size, inner, (node.name,))
