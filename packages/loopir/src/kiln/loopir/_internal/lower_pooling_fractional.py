"""Lowering of fractional max pooling (2d, 3d): a window max with indices whose windows start at
places computed from random samples (issue 20).

ATen's op takes the samples as a tensor (``random_samples``, one per batch, plane and pooled
dim, drawn by the module in eager before the call), so no random numbers are drawn here. The
window of output point ``o`` along a dim of ``size`` elements, ``out`` points and ``kernel``
positions starts where eager's CPU kernel (FractionalMaxPool2d.cpp, `generate_intervals`) puts
it, computed in the samples' floating dtype as there::

    alpha = float(size - kernel) / float(out - 1)
    start(o) = int((o + sample) * alpha) - int(sample * alpha)    for o < out - 1
    start(out - 1) = size - kernel

The start is a loaded value, so it becomes an index through `ops.indirect_indexing`; a window
never leaves the input. The values and indices are `max_with_indices`' two reductions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from .lower import LoweringError, node_location
from .lower_pointwise import broadcast_load
from .lower_pooling import I64, max_with_indices
from .registry import Lowerings
from .sizes import Expr, compute_dtype, contiguous_strides, to_exprs
from .values import Lazy

aten = torch.ops.aten
TABLE = Lowerings()


def _window_start(ops: Any, sample: Any, o: Expr, size: Expr, out: Expr, kernel: int,
                  dtype: torch.dtype) -> Any:
    """The int64 start of output point `o`'s window along one dim, as eager's CPU kernel."""
    def real(expr: Expr) -> Any:
        return ops.to_dtype(ops.index_expr(expr, I64), dtype)

    alpha = ops.truediv(real(size - kernel), real(out - 1))
    spread = ops.sub(ops.to_dtype(ops.mul(ops.add(real(o), sample), alpha), I64),
                     ops.to_dtype(ops.mul(sample, alpha), I64))
    last = ops.index_expr(size - kernel, I64)
    return ops.where(ops.lt(ops.index_expr(o, I64), ops.index_expr(out - 1, I64)), spread, last)


def _sample_dim(n: int, dim: int) -> int:
    """Which of a plane's `n` samples the pooled dim `dim` uses: eager's kernels take the width's
    from sample 0 and the height's from sample 1 (2d), and time, height, width from 0, 1, 2 (3d)."""
    return n - 1 - dim if n == 2 else dim


def _fractional_max_pool(ctx, node, x, samples, n: int, kernel_size: Sequence[int]):
    if x.dtype not in (torch.float32, torch.float64) or samples.dtype != x.dtype:
        raise LoweringError(f"fractional max pooling of {x.dtype} (samples {samples.dtype}) is not lowered; "
                            f"float32 and float64 are: {node_location(node)}")
    values_out = node.meta["val"][0]
    sizes, outs = x.size[len(x.size) - n:], to_exprs(values_out.shape)[len(x.size) - n:]
    kernel = [int(k) for k in kernel_size]
    batch_dims = len(x.size) - n  # (N, C) or (C,)
    dtype = compute_dtype(x.dtype)
    plane = contiguous_strides(sizes)
    x = ctx.realize(x) if isinstance(x, Lazy) else x  # read by both reductions, at loaded places

    def window(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> tuple[Any, None, Any]:
        planes = tuple(index[:batch_dims])
        sample_of = (0, *planes) if batch_dims == 1 else planes
        at, position = list(planes), None
        for dim in range(n):
            sample = broadcast_load(ops, samples, (*sample_of, _sample_dim(n, dim)), dtype)
            start = _window_start(ops, sample, index[batch_dims + dim], sizes[dim], outs[dim], kernel[dim], dtype)
            coord = ops.add(start, ops.index_expr(rindex[dim], I64))
            at.append(ops.indirect_indexing(coord, sizes[dim]))
            term = ops.mul(coord, ops.index_expr(plane[dim], I64))
            position = term if position is None else ops.add(position, term)
        return broadcast_load(ops, x, tuple(at), dtype), None, position

    return max_with_indices(ctx, node, dtype, [sympy.Integer(k) for k in kernel], window)


@TABLE.register("reduction", aten.fractional_max_pool2d.default)
def lower_fractional_max_pool2d(ctx, node, x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(ctx, node, x, random_samples, 2, kernel_size)


@TABLE.register("reduction", aten.fractional_max_pool3d.default)
def lower_fractional_max_pool3d(ctx, node, x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(ctx, node, x, random_samples, 3, kernel_size)
