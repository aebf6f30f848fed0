"""Searches in sorted sequences as loop bodies: searchsorted and bucketize.

Each output element runs eager's binary search (aten's cus_lower_bound / cus_upper_bound) over
its row of the sorted sequence, unrolled: a search over n elements takes at most
ceil(log2(n + 1)) steps, each one load of the sequence at a data-dependent place
(`ops.indirect_indexing`); a step whose interval is already empty changes nothing, and its
load is clamped into the row. A row whose length is symbolic unrolls the steps of the longest
row an int64 index allows (63). The probes, their order and the comparison (``!(x >= value)``
moves right, so NaNs compare as eager's do) are eager's, so results agree even on rows that are
not sorted, where the result is unspecified.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from .lower_pointwise import broadcast_load, out_dtype_size, promoted_dtype
from .registry import Lowerings
from .sizes import Expr, compute_dtype
from .values import Lazy, StridedView

aten = torch.ops.aten
TABLE = Lowerings()
I64 = torch.int64
INT64_INDEX_BITS = 63  # steps of a search over a row of unknown length


def search_steps(length: Expr) -> int:
    """How many binary-search steps a row of `length` elements needs: each step leaves at most
    half of the interval (rounded down), so ceil(log2(length + 1))."""
    length = sympy.sympify(length)
    return int(length).bit_length() if length.is_Integer else INT64_INDEX_BITS


def search(ops: Any, probe_at: Any, value: Any, length: Expr, *, right: bool) -> Any:
    """The int64 position of the first of `length` sorted elements (`probe_at(ops value of a
    position)` loads one) that is >= `value` (> with `right`), else `length`: eager's probes."""
    one = ops.constant(1, I64)
    low, high = ops.constant(0, I64), ops.index_expr(length, I64)
    last = ops.index_expr(length - 1, I64)
    for _ in range(search_steps(length)):
        middle = ops.add(low, ops.right_shift(ops.sub(high, low), one))
        probe = probe_at(ops.minimum(middle, last))  # an empty interval probes in bounds
        beyond = ops.gt(probe, value) if right else ops.ge(probe, value)
        active = ops.lt(low, high)
        low = ops.where(ops.logical_and(active, ops.logical_not(beyond)), ops.add(middle, one), low)
        high = ops.where(ops.logical_and(active, beyond), middle, high)
    return low


def _load(ops: Any, value: StridedView, index: tuple[Expr, ...], dtype: torch.dtype) -> Any:
    loaded = value.load(ops, index)
    return loaded if value.dtype == dtype else ops.to_dtype(loaded, dtype)


def _binary_search(ctx, node, sequence: Any, values: Any, *, right: bool, out_int32: bool,
                   sorter: Any = None) -> Lazy:
    """For each element of `values` (a value of the output's shape, or a number), the position of
    its first sequence element (in the row of the same leading index, for an N-d sequence) that
    is >= it (> it with `right`), in the order `sorter` gives (a permutation per row), else the
    row's length."""
    out_dtype, out_size = out_dtype_size(node)
    dtype = compute_dtype(promoted_dtype(sequence, values))
    if dtype == torch.bool:
        raise NotImplementedError(f"{node.target} of bool tensors (eager refuses them)")
    sequence = ctx.realize(sequence) if isinstance(sequence, Lazy) else sequence
    sorter = ctx.realize(sorter) if isinstance(sorter, Lazy) else sorter
    length = sequence.size[-1]
    batched = len(sequence.size) > 1

    def row_load(ops: Any, row: tuple[Expr, ...], position: Any) -> Any:
        place = ops.indirect_indexing(position, length)
        if sorter is None:
            return _load(ops, sequence, row + (place,), dtype)
        order = _load(ops, sorter, row + (place,), I64)
        # eager refuses a negative sorter entry: n is out of range, so the index check raises
        order = ops.where(ops.lt(order, ops.constant(0, I64)), ops.index_expr(length, I64), order)
        return _load(ops, sequence, row + (ops.indirect_indexing(order, length),), dtype)

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        value = broadcast_load(ops, values, index, dtype)
        row = tuple(index[:-1]) if batched else ()
        low = search(ops, lambda position: row_load(ops, row, position), value, length, right=right)
        return low if out_dtype == I64 else ops.to_dtype(low, out_dtype)

    if out_dtype != (torch.int32 if out_int32 else I64):
        raise NotImplementedError(f"{node.target} returning {out_dtype}")
    return Lazy(out_dtype, out_size, inner, (node.name,))


@TABLE.register("pointwise", aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def lower_searchsorted(ctx, node, sorted_sequence, values, *, out_int32=False, right=False, side=None,
                       sorter=None):
    return _binary_search(ctx, node, sorted_sequence, values, right=right or side == "right",
                          out_int32=out_int32, sorter=sorter)


@TABLE.register("pointwise", aten.bucketize.Tensor, aten.bucketize.Scalar)
def lower_bucketize(ctx, node, values, boundaries, *, out_int32=False, right=False):
    return _binary_search(ctx, node, boundaries, values, right=right, out_int32=out_int32)
