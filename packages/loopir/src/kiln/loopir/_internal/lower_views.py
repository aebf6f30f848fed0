"""Lowerings of views (no copies: strides or index functions), size queries and extern calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx as fx

from .lower import size_expr
from .registry import Lowerings
from .sizes import Expr, contiguous_strides, flat_index, numel, to_expr, to_exprs, unflatten
from .values import Lazy, StridedView, as_lazy

aten = torch.ops.aten
TABLE = Lowerings()


def _out_size(node) -> tuple[Expr, ...]:
    return to_exprs(node.meta["val"].shape)


def _remap(value, size, view_size, view_stride, offset, index_fn, origin):
    """Apply a view: as new strides when `value` is a buffer, as an index function otherwise."""
    if isinstance(value, StridedView):
        return StridedView(value.buffer, value.dtype, tuple(view_size), tuple(view_stride), offset)
    return as_lazy(value, size, index_fn, origin)


@TABLE.register("view", aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def lower_view(ctx, node, x, shape):
    size = _out_size(node)
    if isinstance(x, StridedView):
        if x.is_contiguous():
            return StridedView(x.buffer, x.dtype, size, contiguous_strides(size), x.offset)
        # A view of a strided buffer (attention's output read back through its transpose, ...)
        # stays a view where eager's would: an extern reading it then needs no copy kernel.
        stride = view_strides(x.size, x.stride, size)
        if stride is not None:
            return StridedView(x.buffer, x.dtype, size, stride, x.offset)
    out_strides = contiguous_strides(size)
    return as_lazy(x, size, lambda idx: unflatten(flat_index(idx, out_strides), x.size), node.name)


def view_strides(size: Sequence[Expr], stride: Sequence[Expr], new_size: Sequence[Expr]) -> tuple[Expr, ...] | None:
    """The strides of a view of shape `new_size` of a tensor laid out as (`size`, `stride`), or
    None where no strides give that view (eager's `view` refuses then and `reshape` copies).

    The dims of `size` split into chunks that are contiguous among themselves (each dim's stride
    is the next one's stride times its size); a view may regroup the dims inside a chunk, never
    across chunks. Sizes of 1 never start a chunk. Integer sizes only (a symbolic size returns
    None, and the caller reads through an index function)."""
    if not all(isinstance(e, sympy.Integer) for e in (*size, *stride, *new_size)):
        return None
    size, stride, new_size = [int(e) for e in size], [int(e) for e in stride], [int(e) for e in new_size]
    if 0 in size or not size:
        return None
    out: list[int] = [0] * len(new_size)
    view_d = len(new_size) - 1
    chunk_stride, chunk_numel, view_numel = stride[-1], 1, 1
    for d in range(len(size) - 1, -1, -1):
        chunk_numel *= size[d]
        if d > 0 and (size[d - 1] == 1 or stride[d - 1] == chunk_numel * chunk_stride):
            continue  # the chunk goes on through dim d - 1
        while view_d >= 0 and (view_numel < chunk_numel or new_size[view_d] == 1):
            out[view_d] = view_numel * chunk_stride
            view_numel *= new_size[view_d]
            view_d -= 1
        if view_numel != chunk_numel:
            return None
        if d > 0:
            chunk_stride, chunk_numel, view_numel = stride[d - 1], 1, 1
    if view_d != -1:
        return None
    return tuple(sympy.Integer(s) for s in out)


@TABLE.register("view", aten.alias.default, aten.detach.default)
def lower_alias(ctx, node, x):
    return x


@TABLE.register("view", aten.permute.default)
def lower_permute(ctx, node, x, dims):
    rank = len(x.size)
    dims = [d % rank for d in dims]
    inverse = [dims.index(k) for k in range(rank)]
    size = [x.size[d] for d in dims]
    stride = [x.stride[d] for d in dims] if isinstance(x, StridedView) else None
    offset = x.offset if isinstance(x, StridedView) else None
    return _remap(x, size, size, stride, offset, lambda idx: tuple(idx[inverse[k]] for k in range(rank)),
                  node.name)


@TABLE.register("view", aten.t.default)
def lower_t(ctx, node, x):
    return lower_permute(ctx, node, x, [1, 0]) if len(x.size) == 2 else x


@TABLE.register("view", aten.transpose.int)
def lower_transpose(ctx, node, x, d0, d1):
    rank = len(x.size)
    dims = list(range(rank))
    if rank:
        dims[d0 % rank], dims[d1 % rank] = dims[d1 % rank], dims[d0 % rank]
    return lower_permute(ctx, node, x, dims)


@TABLE.register("view", aten.expand.default)
def lower_expand(ctx, node, x, sizes, *, implicit=False):
    size = _out_size(node)
    lead = len(size) - len(x.size)

    def index_fn(idx: Sequence[Expr]) -> tuple[Expr, ...]:
        own = idx[lead:]
        return tuple(sympy.Integer(0) if s == 1 else i for i, s in zip(own, x.size))

    if isinstance(x, StridedView):
        stride = [sympy.Integer(0)] * lead + [
            sympy.Integer(0) if (s == 1 and o != 1) else st for s, st, o in zip(x.size, x.stride, size[lead:])]
        return StridedView(x.buffer, x.dtype, size, tuple(stride), x.offset)
    return as_lazy(x, size, index_fn, node.name)


@TABLE.register("view", aten.unsqueeze.default)
def lower_unsqueeze(ctx, node, x, dim):
    dim = dim % (len(x.size) + 1)
    size = list(x.size[:dim]) + [sympy.Integer(1)] + list(x.size[dim:])
    if isinstance(x, StridedView):
        stride = list(x.stride[:dim]) + [sympy.Integer(1)] + list(x.stride[dim:])
        return StridedView(x.buffer, x.dtype, tuple(size), tuple(stride), x.offset)
    return as_lazy(x, size, lambda idx: tuple(idx[:dim]) + tuple(idx[dim + 1:]), node.name)


@TABLE.register("view", aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def lower_squeeze(ctx, node, x, dims=None):
    rank = len(x.size)
    if dims is None:
        candidates = range(rank)
    else:
        candidates = [d % rank for d in ([dims] if isinstance(dims, int) else dims)] if rank else []
    removed = {d for d in candidates if x.size[d] == 1}
    kept = [d for d in range(rank) if d not in removed]
    size = [x.size[d] for d in kept]

    def index_fn(idx: Sequence[Expr]) -> tuple[Expr, ...]:
        full = [sympy.Integer(0)] * rank
        for pos, d in enumerate(kept):
            full[d] = idx[pos]
        return tuple(full)

    if isinstance(x, StridedView):
        return StridedView(x.buffer, x.dtype, tuple(size), tuple(x.stride[d] for d in kept), x.offset)
    return as_lazy(x, size, index_fn, node.name)


@TABLE.register("view", aten.slice.Tensor)
def lower_slice(ctx, node, x, dim=0, start=None, end=None, step=1):
    dim = dim % len(x.size)
    size = list(_out_size(node))
    begin = _slice_start(start, x.size[dim], size[dim])

    def index_fn(idx: Sequence[Expr]) -> tuple[Expr, ...]:
        return tuple(begin + i * step if k == dim else i for k, i in enumerate(idx))

    if isinstance(x, StridedView):
        stride = list(x.stride)
        stride[dim] = x.stride[dim] * step
        return StridedView(x.buffer, x.dtype, tuple(size), tuple(stride), x.offset + begin * x.stride[dim])
    return as_lazy(x, size, index_fn, node.name)


def _slice_start(start: Any, dim_size: Expr, out_len: Expr) -> Expr:
    """The first index a slice reads, clamped into `[0, dim_size]` as torch does.

    With a symbolic `dim_size` torch decides the clamp under a shape guard; its output length
    shows which way it went: no Max/Min in it means the start was in range.
    """
    if start is None:
        return sympy.Integer(0)
    start = to_expr(start)
    if not start.is_number:
        # A symbolic start may be negative or past the end at run time: wrapped, then clamped,
        # as eager does, in the integer ops every size evaluator has (Min, Max, *, +).
        clamped = sympy.Min(sympy.Max(start, -dim_size), dim_size)
        negative = sympy.Min(sympy.Max(-clamped, 0), 1)  # 1 where clamped < 0, else 0
        return clamped + dim_size * negative
    if start < 0:
        shifted = start + dim_size
        if dim_size.is_number or out_len.has(sympy.Max, sympy.Min):
            return sympy.Max(shifted, 0)
        return shifted
    return sympy.Min(start, dim_size) if dim_size.is_number else start


def runtime_index(ops: Any, index: Expr, size: Expr) -> Expr:
    """A symbolic (SymInt) index as eager takes it at run time: negative values wrap by `size`,
    values outside [-size, size) raise IndexError (the kernel's index check)."""
    return ops.indirect_indexing(ops.index_expr(index, torch.int64), size)


@TABLE.register("view", aten.select.int)
def lower_select(ctx, node, x, dim, index):
    dim = dim % len(x.size)
    index = to_expr(index)
    if index.is_number and index < 0:
        index = index + x.size[dim]
    size = [s for k, s in enumerate(x.size) if k != dim]
    if not index.is_number:
        # A symbolic index may be negative at run time: loads wrap (and check) it, as eager does.
        # (A strided view's offset cannot: it is computed on the host, unchecked.)
        def inner(ops: Any, idx: tuple[Expr, ...]) -> Any:
            at = runtime_index(ops, index, x.size[dim])
            return x.load(ops, tuple(idx[:dim]) + (at,) + tuple(idx[dim:]))

        origins = x.origins if isinstance(x, Lazy) else ()
        return Lazy(x.dtype, tuple(size), inner, origins + (node.name,),
                    x.computed if isinstance(x, Lazy) else None)
    if isinstance(x, StridedView):
        stride = tuple(s for k, s in enumerate(x.stride) if k != dim)
        return StridedView(x.buffer, x.dtype, tuple(size), stride, x.offset + index * x.stride[dim])
    return as_lazy(x, size, lambda idx: tuple(idx[:dim]) + (index,) + tuple(idx[dim:]), node.name)


def diagonal_dims(rank: int, offset: int, dim1: int, dim2: int) -> tuple[list[int], int, int, int, int]:
    """(kept dims, dim1, dim2, first row, first column) of `x.diagonal(offset, dim1, dim2)`."""
    dim1, dim2 = dim1 % rank, dim2 % rank
    kept = [d for d in range(rank) if d not in (dim1, dim2)]
    return kept, dim1, dim2, max(-offset, 0), max(offset, 0)


@TABLE.register("view", aten.diagonal.default)
def lower_diagonal(ctx, node, x, offset=0, dim1=0, dim2=1):
    size = _out_size(node)  # the kept dims, then the diagonal
    kept, dim1, dim2, row, col = diagonal_dims(len(x.size), offset, dim1, dim2)

    def index_fn(idx: Sequence[Expr]) -> tuple[Expr, ...]:
        full = [sympy.Integer(0)] * len(x.size)
        for pos, d in enumerate(kept):
            full[d] = idx[pos]
        full[dim1], full[dim2] = idx[-1] + row, idx[-1] + col
        return tuple(full)

    stride = offset_ = None
    if isinstance(x, StridedView):
        stride = [x.stride[d] for d in kept] + [x.stride[dim1] + x.stride[dim2]]
        offset_ = x.offset + row * x.stride[dim1] + col * x.stride[dim2]
    return _remap(x, size, size, stride, offset_, index_fn, node.name)


@TABLE.register("view", aten.unfold.default)
def lower_unfold(ctx, node, x, dimension, size, step):
    out_size = _out_size(node)  # dim `dimension` counts windows; a new last dim walks one window
    rank = len(x.size)
    dim = dimension % rank if rank else 0

    def index_fn(idx: Sequence[Expr]) -> tuple[Expr, ...]:
        if not rank:
            return ()
        return tuple(idx[d] * step + idx[-1] if d == dim else idx[d] for d in range(rank))

    stride = offset = None
    if isinstance(x, StridedView):
        inner = x.stride[dim] if rank else sympy.Integer(1)
        stride = [st * step if d == dim else st for d, st in enumerate(x.stride)] + [inner]
        offset = x.offset
    return _remap(x, out_size, out_size, stride, offset, index_fn, node.name)


@TABLE.register("extern", aten.mm.default, aten.addmm.default, aten.bmm.default)
def lower_extern(ctx, node, *args, **kwargs):
    # An operand computed in this graph is stored as eager lays it out (`realize_in_memory_order`):
    # a transposed pointwise result (a backward's `where(relu <= 0, 0, grad).t()` read by the
    # weight-gradient mm) is then written in its producer's order, contiguously, and the matmul
    # reads it transposed, which BLAS does at no cost; stored in the transpose's own order, the
    # kernel read its inputs with a stride (CPU MLP training step, with `schedule._walks_across`: its
    # backward kernels 560 + 282 -> 257 + 225 + 220 us, BENCHMARKS.md session 16).
    args = tuple(ctx.realize_in_memory_order(value, ctx.eager_values.get(arg, arg.meta.get("val")))
                 if isinstance(value, Lazy) and isinstance(arg, fx.Node) else value
                 for value, arg in zip(args, node.args))
    return ctx.add_extern(node, args, kwargs)



@TABLE.register("size", aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default)
def lower_size_query(ctx, node, *args):
    # Symbolic tracing records these; meta["val"] holds the answer as a size expression.
    return size_expr(node)


@TABLE.register("view", aten.as_strided.default)
def lower_as_strided(ctx, node, x, size, stride, storage_offset=None):
    """as_strided of a value whose elements hold, in eager, a dense block of its storage (the
    chunks `split` makes of a matmul's result, a channels-last value read with explicit
    strides): it reads that block as eager does. The value is read as it is when it is a
    buffer laid out with eager's strides, else stored first with eager's layout (see
    `LoweringContext.realize_in_memory_order`). The view may address only that block: where
    that is not known for every size (dynamic shapes), each element's address is checked at
    run time (an IndexError, where eager refuses the view)."""
    base = node.args[0].meta["val"]
    base_stride = to_exprs(base.stride())
    if not _dense(base.shape, base_stride):
        raise NotImplementedError(f"as_strided of a value laid out with gaps or overlaps ({list(base.stride())})")
    size, stride = to_exprs(size), to_exprs(stride)
    first = to_expr(storage_offset if storage_offset is not None else base.storage_offset())
    start = first - to_expr(base.storage_offset())  # counted from the value's first element
    if not all(sympy.simplify(e).is_nonnegative for e in (start, *stride)):
        raise NotImplementedError("as_strided with a negative stride or an offset before its input's elements")
    if not (isinstance(x, StridedView) and _same_layout(x.size, x.stride, base_stride)):
        x = ctx.realize_in_memory_order(as_lazy(x, x.size, lambda idx: idx, node.name), base)
        if not _same_layout(x.size, x.stride, base_stride):  # no dense order known (symbolic)
            raise NotImplementedError("as_strided of a value whose layout kiln cannot give eager's")
    count = numel(to_exprs(base.shape))
    if _within(start, size, stride, count):
        return StridedView(x.buffer, x.dtype, size, stride, x.offset + start)

    def checked(ops: Any, index: tuple[Expr, ...]) -> Any:
        address = flat_index(index, stride, start)
        return ops.load(x.buffer, x.offset + ops.indirect_indexing(ops.index_expr(address, torch.int64), count))

    return Lazy(x.dtype, tuple(size), checked, (node.name,))


def _dense(shape: Sequence[Any], stride: Sequence[Expr]) -> bool:
    """Whether `shape`/`stride` cover a block of memory exactly once (dims ordered by stride)."""
    sizes = to_exprs(shape)
    order = sorted((d for d in range(len(sizes)) if sizes[d] != 1), key=lambda d: _sort_key(stride[d]))
    expected: Expr = sympy.Integer(1)
    for d in order:
        if sympy.simplify(stride[d] - expected) != 0:
            return False
        expected = expected * sizes[d]
    return True


def _sort_key(stride: Expr) -> Any:
    return (0, int(stride)) if stride.is_Integer else (1, sympy.count_ops(stride), str(stride))


def _within(start: Expr, size: Sequence[Expr], stride: Sequence[Expr], count: Expr) -> bool:
    """Whether the last element `start + sum((size - 1) * stride)` is below `count` at every size."""
    if any(s == 0 for s in size):
        return True
    last = start + sum(((s - 1) * st for s, st in zip(size, stride)), sympy.Integer(0))
    return bool(sympy.simplify(count - 1 - last).is_nonnegative)


def _same_layout(size: Sequence[Expr], stride: Sequence[Expr], expected: Sequence[Expr]) -> bool:
    return all(s == 1 or sympy.simplify(a - b) == 0 for s, a, b in zip(size, stride, expected))
