"""Ops over segments of a list (issue 20): repeat_interleave with a repeats tensor (known output
size) and embedding_bag (sum, mean, max).

A segment's bounds come from a cumulative count or an offsets list, and the segment an element
belongs to from a binary search in it (`lower_special_search.search`):

* ``repeat_interleave(repeats, output_size=n)``: element j of the result is the position of the
  first running total of `repeats` (a `Scan`) greater than j;
* ``embedding_bag``: index k belongs to bag ``search(offsets, k, right) - 1``; the bags are a
  `Scatter` of the weight rows (times per_sample_weights) into zeros: a sum, a mean (a sum and
  a count), or a max (the bags hit start at -inf, empty bags stay 0, as in eager). Only the
  bags (output 0) of `_embedding_bag_forward_only` are lowered (bfloat16/float16 accumulate
  in float32, as eager's kernel): offset2bag, bag_size and max_indices follow eager's CPU
  kernel's quirks (empty in some modes), so a graph that reads them keeps the op in eager.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from .ir import Scan
from .lower import LoweringError, node_location
from .lower_pointwise import broadcast_load, constant
from .lower_scatter import mean_by_count, scatter_node
from .lower_special_search import search
from .registry import Lowerings
from .sizes import Expr, compute_dtype, numel, to_exprs
from .values import Lazy, StridedView

aten = torch.ops.aten
TABLE = Lowerings()
I64 = torch.int64


def _known_size(node: Any, size: tuple[Expr, ...]) -> None:
    if any(s.free_symbols and any(sym.name.startswith("u") for sym in s.free_symbols) for s in map(sympy.sympify,
                                                                                                    size)):
        raise LoweringError(f"an output size known only at run time ({list(size)}) is not lowered; give "
                            f"output_size: {node_location(node)}")


def _running_total(ctx: Any, node: Any, values: Any) -> StridedView:
    """The inclusive cumulative sum of 1-D `values`, in int64, as a buffer (a `Scan`)."""
    (length,) = values.size

    def inner(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        return broadcast_load(ops, values, rindex, I64)

    return ctx.add_reduction(Scan((), (length,), "sum", inner, I64, scan_dim=0), (length,), node.name)


@TABLE.register("reduction", aten.repeat_interleave.Tensor)
def lower_repeat_interleave(ctx, node, repeats, *, output_size=None):
    val = node.meta["val"]
    size = to_exprs(val.shape)
    _known_size(node, size)
    totals = _running_total(ctx, node, repeats)
    (length,) = repeats.size

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        position = ops.index_expr(index[0], I64)
        found = search(ops, lambda at: totals.load(ops, (ops.indirect_indexing(at, length),)), position, length,
                       right=True)
        return found if val.dtype == I64 else ops.to_dtype(found, val.dtype)

    return Lazy(val.dtype, tuple(size), inner, (node.name,))


_MODES = {0: "sum", 1: "mean", 2: "max"}


def _aux_outputs_unused(node: Any) -> bool:
    return all(user.target.__name__ == "getitem" and user.args[1] == 0 or not user.users for user in node.users)


@TABLE.register("reduction", aten._embedding_bag_forward_only.default)
def lower_embedding_bag(ctx, node, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                        per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    if not _aux_outputs_unused(node):
        raise LoweringError(f"embedding_bag's offset2bag/bag_size/max_indices are not lowered: {node_location(node)}")
    padded = padding_idx is not None and padding_idx >= 0
    if (mode == 2 or include_last_offset) and padded or mode == 2 and include_last_offset:
        # eager's CPU kernel treats the indices past the last offset differently on each of these paths
        raise LoweringError(f"embedding_bag with two of max, padding_idx and include_last_offset is not lowered: "
                            f"{node_location(node)}")
    bags_val = node.meta["val"][0]
    # bfloat16/float16 bags accumulate in float32 and round once, as eager's kernel does
    out_dtype, size = bags_val.dtype, tuple(to_exprs(bags_val.shape))
    dtype = computed = compute_dtype(out_dtype)
    (count,) = indices.size
    (n_offsets,) = offsets.size
    rows, dim = weight.size

    def bag_of(ops: Any, k: Expr) -> tuple[Any, Any]:
        """(the bag index k belongs to, whether it belongs to none: past the last offset of
        include_last_offset; such an index adds 0 to the last bag, as in eager)."""
        position = ops.index_expr(k, I64)
        found = search(ops, lambda at: broadcast_load(ops, offsets, (ops.indirect_indexing(at, n_offsets),), I64),
                       position, n_offsets, right=True)
        bag = ops.sub(found, ops.constant(1, I64))
        if not include_last_offset:
            return bag, None
        outside = ops.eq(found, ops.index_expr(n_offsets, I64))
        return ops.where(outside, ops.index_expr(size[0] - 1, I64), bag), outside

    def element(value_of: Any, counts_outside: bool = False) -> Any:
        def fn(ops: Any, position: tuple[Expr, ...]) -> tuple[Any, tuple[Expr, ...]]:
            k, d = position
            row = broadcast_load(ops, indices, (k,), I64)
            value = value_of(ops, k, d, row)
            bag, outside = bag_of(ops, k)
            skipped = [outside] if outside is not None and not counts_outside else []
            if padded:
                skipped.append(ops.eq(row, ops.constant(int(padding_idx), I64)))
            for skip in skipped:
                value = ops.where(skip, constant(ops, 0, computed), value)
            return value, (ops.indirect_indexing(bag, size[0]), d)

        return fn

    def weighted(ops: Any, k: Expr, d: Expr, row: Any) -> Any:
        value = broadcast_load(ops, weight, (ops.indirect_indexing(row, rows), d), computed)
        if per_sample_weights is not None:
            value = ops.mul(value, broadcast_load(ops, per_sample_weights, (k,), computed))
        return value

    def one(ops: Any, k: Expr, d: Expr, row: Any) -> Any:
        return constant(ops, 1, computed)

    zeros = ctx.realize(Lazy(dtype, size, lambda ops, i: constant(ops, 0, computed), (node.name,)))
    source = (count, dim)
    if numel(size) == 0 or count == 0:
        bags = zeros
    elif _MODES[mode] == "max":
        lowest = -float("inf") if dtype.is_floating_point else torch.iinfo(dtype).min
        hit = scatter_node(ctx, node, zeros, source,
                           element(lambda ops, k, d, row: constant(ops, lowest, computed)), "store")
        bags = scatter_node(ctx, node, hit, source, element(weighted), "max")
    elif _MODES[mode] == "sum":
        bags = scatter_node(ctx, node, zeros, source, element(weighted), "sum")
    else:
        total = scatter_node(ctx, node, zeros, source, element(weighted), "sum")
        # eager's mean divides the last bag of include_last_offset by its size up to the end of
        # `indices`, counting the indices past the last offset it does not add
        counts = scatter_node(ctx, node, zeros, source, element(one, counts_outside=True), "sum")
        bags = mean_by_count(node, total, counts, dtype, size)
    if out_dtype == dtype:
        return (bags, *_unused(node))
    rounded = Lazy(out_dtype, size, lambda ops, i: broadcast_load(ops, bags, i, computed), (node.name,), computed)
    return (rounded, *_unused(node))


def _unused(node: Any) -> tuple[Lazy, ...]:
    """Stand-ins for the outputs nothing reads (checked by `_aux_outputs_unused`)."""
    return tuple(Lazy(val.dtype, tuple(to_exprs(val.shape)), lambda ops, i, d=val.dtype: constant(ops, 0, d),
                      (node.name,)) for val in node.meta["val"][1:])
