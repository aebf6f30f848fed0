"""Lowerings of window reductions: avg/max pooling (1-3d) and adaptive pooling, their backward
ops, and upsample_nearest backward, as loop-level reductions over windows (issue 20).

Every op here is a `Reduction` whose reduction ranges are a window, one range per pooled dim,
read through an `_Axis` per dim: window position ``r`` of the point at coordinate ``o`` reads
coordinate ``coord(o, r)`` of the tensor. Positions that fall outside the tensor (padding) or
outside the point's own window (adaptive windows of varying size) are loaded at a clamped
coordinate and masked with `ops.where`, to 0 for sums and the lowest value for maxima.

* Forward pooling: the window of an output point, ``k`` positions per dim.
* Backward ops are gathers, never scatters: the reduction runs over the output points whose
  windows may hold an input element (a range bounded by its maximum size, the rest masked),
  and takes what each sends there: ``grad / divisor`` (avg), ``grad`` where the saved index
  is this element (max), ``grad`` where nearest upsampling read this element.
* max pooling's indices: a second reduction over the window, after the max, finds where it is
  (see `_max_with_indices`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from .ir import Reduction
from .lower import LoweringError, node_location
from .lower_pointwise import broadcast_load, constant
from .registry import Lowerings
from .sizes import Expr, FloorDiv, compute_dtype, contiguous_strides, flat_index, to_exprs
from .values import Lazy, StridedView

aten = torch.ops.aten
TABLE = Lowerings()
I64 = torch.int64


# --------------------------------------------------------------------------- windows


def _register(kind: str, *ops: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`TABLE.register`, for lowerings whose outputs are zeros where they have no element: an
    empty output has no window to read, and no index math is generated for it."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def lower(ctx, node, *args, **kwargs):
            outs = node.meta["val"]
            outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
            if any(out.numel() == 0 for out in outs if isinstance(out.numel(), int)):
                empty = tuple(Lazy(out.dtype, to_exprs(out.shape), lambda ops, index, d=out.dtype: constant(ops, 0, d),
                                   (node.name,)) for out in outs)
                return empty if len(empty) > 1 else empty[0]
            return fn(ctx, node, *args, **kwargs)

        TABLE.register(kind, *ops)(lower)
        return fn

    return decorate




@dataclasses.dataclass(frozen=True)
class _Axis:
    """How one dim of a window reads a tensor whose dim has `size` elements.

    Position ``r < width`` of the point at coordinate ``o`` reads ``coord(o, r)``; it counts
    only where every ``(expr, low, high)`` of ``checks(o, r)`` has ``low <= expr < high`` (a
    bound of None holds). The load clamps the coordinate into the dim where `clamp_low` /
    `clamp_high` say it may leave it.
    """

    size: Expr
    width: Expr
    coord: Callable[[Expr, Expr], Expr]
    checks: Callable[[Expr, Expr], list[tuple[Expr, Expr | None, Expr | None]]] = lambda o, r: []
    clamp_low: bool = False
    clamp_high: bool = False


def _floor_div(x: Expr, d: Expr) -> Expr:
    """``floor(x / d)`` of a non-negative `x`, the terms `d` divides taken out of the division
    (``FloorDiv(8*o, 4)`` is ``2*o``)."""
    x, d = sympy.expand(x), sympy.sympify(d)
    if not d.is_Integer:
        return FloorDiv(x, d)
    high, low = [], []
    for term in sympy.Add.make_args(x):
        coefficient, _ = term.as_coeff_Mul()
        (high if coefficient.is_Integer and coefficient % d == 0 else low).append(term)
    quotient = sympy.expand(sympy.Add(*high) / d)
    return quotient + FloorDiv(sympy.Add(*low), d) if low else quotient


def _holds(fact: Any) -> bool:
    """Whether a sympy relation holds for every value of its size symbols (False: unknown)."""
    return bool(sympy.simplify(fact) == sympy.true)


def _window_point(ops: Any, axes: Sequence[_Axis], index: Sequence[Expr], rindex: Sequence[Expr]
                  ) -> tuple[tuple[Expr, ...], Any, list[Expr]]:
    """(the index to load at, the bool value saying whether the position counts or None when
    it always does, the unclamped coordinates) of window position `rindex` of point `index`."""
    batch = len(index) - len(axes)
    at, conds, coords = list(index[:batch]), [], []
    for axis, o, r in zip(axes, index[batch:], rindex):
        c = axis.coord(o, r)
        coords.append(c)
        for expr, low, high in axis.checks(o, r):
            value = ops.index_expr(expr, I64)
            if low is not None:
                conds.append(ops.ge(value, ops.index_expr(low, I64)))
            if high is not None:
                conds.append(ops.lt(value, ops.index_expr(high, I64)))
        if axis.clamp_low:
            c = sympy.Max(c, 0)
        if axis.clamp_high:
            c = sympy.Min(c, axis.size - 1)
        at.append(c)
    return tuple(at), _all(ops, conds), coords


def _all(ops: Any, conds: Sequence[Any]) -> Any:
    result = None
    for cond in conds:
        result = cond if result is None else ops.logical_and(result, cond)
    return result


def _masked(ops: Any, inside: Any, value: Any, fill: Any, dtype: torch.dtype) -> Any:
    return value if inside is None else ops.where(inside, value, constant(ops, fill, dtype))


def _reduce_windows(ctx, node, out: Any, axes: Sequence[_Axis], reduction_type: str, dtype: torch.dtype,
                    inner: Callable[..., Any], store_dtype: torch.dtype | None = None) -> StridedView:
    """Realize a `reduction_type` Reduction over the windows of `axes` for every point of `out`
    (a FakeTensor: sizes, and the layout eager gives it)."""
    size = to_exprs(out.shape)
    reduction = Reduction(size, tuple(a.width for a in axes), reduction_type, inner, dtype)
    return ctx.add_reduction(reduction, size, node.name, store_dtype or out.dtype, like=out)


def _reread(ctx, x: Any, rereads: bool) -> Any:
    """`x`, realized when a lazy value would otherwise be recomputed for each window reading it."""
    return ctx.realize(x) if rereads and isinstance(x, Lazy) else x


def _spatial(size: Sequence[Expr], n: int) -> tuple[Expr, ...]:
    return tuple(size[len(size) - n:])


def _ntuple(value: Any, n: int) -> tuple[int, ...]:
    values = [value] if isinstance(value, (int, sympy.Expr)) else list(value)
    values = values * n if len(values) == 1 else values
    if len(values) != n:
        raise ValueError(f"expected {n} values, got {value!r}")
    return tuple(int(v) for v in values)


@dataclasses.dataclass(frozen=True)
class _Pool:
    """Pooling parameters of one dim: input and output sizes, kernel, stride, padding, dilation."""

    size: Expr
    out: Expr
    kernel: int
    stride: int
    padding: int
    dilation: int = 1

    @property
    def span(self) -> int:
        return (self.kernel - 1) * self.dilation + 1

    def start(self, o: Expr) -> Expr:
        return o * self.stride - self.padding

    def reaches(self, bound: Expr) -> bool:
        """Whether the last window may read at or past coordinate `bound`."""
        return not _holds(sympy.Lt(self.start(self.out - 1) + self.span - 1, bound))

    def window_axis(self) -> _Axis:
        """The window of an output point: `kernel` positions, `dilation` apart."""
        low, high = self.padding > 0, self.reaches(self.size)
        return _Axis(self.size, sympy.Integer(self.kernel),
                     lambda o, r: self.start(o) + r * self.dilation,
                     lambda o, r: [(self.start(o) + r * self.dilation, 0 if low else None,
                                    self.size if high else None)] if low or high else [],
                     low, high)

    def candidates(self) -> int:
        """How many windows may hold one input element."""
        return (self.span - 1) // self.stride + 1

    def covering_axis(self, exact: bool) -> _Axis:
        """The output points whose windows may hold input coordinate ``i``: ``last(i) - r``,
        where ``last(i)`` is the last window starting at or before ``i``. With `exact`, a
        position counts only where ``i`` is inside its window (dilation 1: avg pooling); else
        the caller tells (max pooling compares the saved index)."""
        count = self.candidates()

        def last(i: Expr) -> Expr:
            return FloorDiv(i + self.padding, self.stride)

        def checks(i: Expr, r: Expr) -> list[tuple[Expr, Expr | None, Expr | None]]:
            c = last(i) - r
            found = [(c, 0 if count > 1 else None, self.out if beyond else None)] if count > 1 or beyond else []
            if exact and count * self.stride > self.kernel:  # i may fall past the window's end
                found.append((i - self.start(c), None, sympy.Integer(self.kernel)))
            return found

        beyond = not _holds(sympy.Lt(last(self.size - 1), self.out))
        return _Axis(self.out, sympy.Integer(count), lambda i, r: last(i) - r, checks, count > 1, beyond)


def _pools(size: Sequence[Expr], out: Sequence[Expr], n: int, kernel_size: Any, stride: Any, padding: Any,
           dilation: Any = 1) -> list[_Pool]:
    """The `_Pool` of each of the last `n` dims, from a pooling op's arguments."""
    kernel = _ntuple(kernel_size, n)
    strides = _ntuple(stride, n) if stride else kernel
    pads, dilations = _ntuple(padding, n), _ntuple(dilation, n)
    return [_Pool(i, o, k, s, p, d)
            for i, o, k, s, p, d in zip(_spatial(size, n), _spatial(out, n), kernel, strides, pads, dilations)]


# --------------------------------------------------------------------------- avg pooling


def _avg_divisor(pools: Sequence[_Pool], coords: Sequence[Expr], count_include_pad: bool,
                 divisor_override: int | None) -> Expr:
    """What eager divides the sum of the window of output point `coords` by."""
    if divisor_override:
        return sympy.Integer(divisor_override)
    total: Expr = sympy.Integer(1)
    for pool, o in zip(pools, coords):
        start = pool.start(o)
        end = sympy.Min(start + pool.kernel, pool.size + pool.padding) \
            if pool.reaches(pool.size + pool.padding) else start + pool.kernel
        if count_include_pad:
            total *= end - start
        else:
            total *= (sympy.Min(end, pool.size) if pool.reaches(pool.size) else end) - \
                (sympy.Max(start, 0) if pool.padding else start)
    return sympy.expand(total)


def _divide(ops: Any, value: Any, divisor: Expr, dtype: torch.dtype) -> Any:
    """`value / divisor` in `dtype`, truncated for integers as eager's integer avg_pool."""
    by = constant(ops, divisor, dtype) if divisor.is_number else ops.index_expr(divisor, dtype)
    return ops.truediv(value, by) if dtype.is_floating_point else ops.truncdiv(value, by)


def _avg_pool(ctx, node, x, n, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
              divisor_override=None):
    out = node.meta["val"]
    pools = _pools(x.size, to_exprs(out.shape), n, kernel_size, stride, padding)
    x = _reread(ctx, x, any(p.stride < p.kernel for p in pools))
    axes = [p.window_axis() for p in pools]
    dtype = compute_dtype(out.dtype)

    def window(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        at, inside, _ = _window_point(ops, axes, index, rindex)
        return _masked(ops, inside, broadcast_load(ops, x, at, dtype), 0, dtype)

    # a low-precision sum stays float32 until divided: one rounding, as eager
    total = _reduce_windows(ctx, node, out, axes, "sum", dtype, window, store_dtype=dtype)

    def average(ops: Any, index: tuple[Expr, ...]) -> Any:
        divisor = _avg_divisor(pools, index[len(index) - n:], count_include_pad, divisor_override)
        return _divide(ops, total.load(ops, index), divisor, dtype)

    return Lazy(out.dtype, total.size, average, (node.name,), dtype if dtype != out.dtype else None)


@_register("reduction", aten.avg_pool2d.default)
def lower_avg_pool2d(ctx, node, x, *args, **kwargs):
    return _avg_pool(ctx, node, x, 2, *args, **kwargs)


@_register("reduction", aten.avg_pool3d.default)
def lower_avg_pool3d(ctx, node, x, *args, **kwargs):
    return _avg_pool(ctx, node, x, 3, *args, **kwargs)


def _avg_pool_backward(ctx, node, grad, x, n, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override=None):
    out = node.meta["val"]
    pools = _pools(to_exprs(out.shape), grad.size, n, kernel_size, stride, padding)
    grad = _reread(ctx, grad, any(p.candidates() > 1 for p in pools))
    axes = [p.covering_axis(exact=True) for p in pools]
    dtype = compute_dtype(out.dtype)

    def sent(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        at, inside, coords = _window_point(ops, axes, index, rindex)
        share = _divide(ops, broadcast_load(ops, grad, at, dtype),
                        _avg_divisor(pools, coords, count_include_pad, divisor_override), dtype)
        return _masked(ops, inside, share, 0, dtype)

    return _reduce_windows(ctx, node, out, axes, "sum", dtype, sent)


@_register("reduction", aten.avg_pool2d_backward.default)
def lower_avg_pool2d_backward(ctx, node, grad, x, *args, **kwargs):
    return _avg_pool_backward(ctx, node, grad, x, 2, *args, **kwargs)


@_register("reduction", aten.avg_pool3d_backward.default)
def lower_avg_pool3d_backward(ctx, node, grad, x, *args, **kwargs):
    return _avg_pool_backward(ctx, node, grad, x, 3, *args, **kwargs)


# --------------------------------------------------------------------------- max pooling


def _lowest(dtype: torch.dtype) -> float | int:
    return float("-inf") if dtype.is_floating_point else torch.iinfo(dtype).min


def _max_with_indices(ctx, node, x, axes: Sequence[_Axis]):
    """(values, indices) of the max over the windows of `axes`; indices are flat in the pooled
    dims, as eager's (see `max_with_indices`)."""
    x = _reread(ctx, x, True)  # read by two reductions
    dtype = compute_dtype(x.dtype)
    plane = contiguous_strides(_spatial(x.size, len(axes)))

    def window(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> tuple[Any, Any, Any]:
        at, inside, coords = _window_point(ops, axes, index, rindex)
        return broadcast_load(ops, x, at, dtype), inside, ops.index_expr(flat_index(coords, plane), I64)

    return max_with_indices(ctx, node, dtype, [a.width for a in axes], window)


def max_with_indices(ctx, node, dtype: torch.dtype, widths: Sequence[Expr], window: Callable[..., Any]):
    """(values, indices) of the max over windows of `widths` positions; ``window(ops, index,
    rindex)`` gives (the value there in `dtype`, a bool value saying whether the position counts
    or None when it always does, its int64 position, flat in the pooled dims). Eager keeps the
    first largest value in window order, but the *last* NaN, and the first element inside the
    input where every value is the lowest (-inf): the index is a `min` reduction, after the
    values' `max` in the same kernel, of the positions of the elements inside the input equal
    to the max, or of minus the positions of the NaNs."""
    values_out, indices_out = node.meta["val"]
    axes = [_Axis(w, w, lambda o, r: r) for w in widths]  # only their widths are read

    def candidate(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        value, inside, _ = window(ops, index, rindex)
        return _masked(ops, inside, value, _lowest(dtype), dtype)

    values = _reduce_windows(ctx, node, values_out, axes, "max", dtype, candidate)
    never = torch.iinfo(I64).max

    def position(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        value, inside, at = window(ops, index, rindex)
        best = broadcast_load(ops, values, index, dtype)
        key = ops.where(ops.eq(value, best), at, constant(ops, never, I64))
        if dtype.is_floating_point:
            nan_key = ops.where(ops.isnan(value), ops.neg(at), constant(ops, never, I64))
            key = ops.where(ops.isnan(best), nan_key, key)
        return _masked(ops, inside, key, never, I64)

    found = _reduce_windows(ctx, node, indices_out, axes, "min", I64, position)
    if not dtype.is_floating_point:
        return values, found

    def index_of(ops: Any, index: tuple[Expr, ...]) -> Any:
        key = found.load(ops, index)
        return ops.where(ops.isnan(broadcast_load(ops, values, index, dtype)), ops.neg(key), key)

    return values, Lazy(I64, found.size, index_of, (node.name,))


def _max_pool(ctx, node, x, n, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    pools = _pools(x.size, to_exprs(node.meta["val"][0].shape), n, kernel_size, stride, padding, dilation)
    return _max_with_indices(ctx, node, x, [p.window_axis() for p in pools])


@_register("reduction", aten.max_pool2d_with_indices.default)
def lower_max_pool2d_with_indices(ctx, node, x, *args, **kwargs):
    return _max_pool(ctx, node, x, 2, *args, **kwargs)


@_register("reduction", aten.max_pool3d_with_indices.default)
def lower_max_pool3d_with_indices(ctx, node, x, *args, **kwargs):
    return _max_pool(ctx, node, x, 3, *args, **kwargs)


def _gather_by_index(ctx, node, grad, indices, axes: Sequence[_Axis], rereads: bool):
    """The max pooling backward: each input element sums the gradients of the output points
    (candidates of `axes`) whose saved index is that element."""
    out = node.meta["val"]
    n = len(axes)
    grad, indices = _reread(ctx, grad, rereads), _reread(ctx, indices, rereads)
    dtype = compute_dtype(out.dtype)
    plane = contiguous_strides(_spatial(to_exprs(out.shape), n))

    def sent(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        at, inside, _ = _window_point(ops, axes, index, rindex)
        mine = ops.eq(broadcast_load(ops, indices, at, I64), ops.index_expr(flat_index(index[len(index) - n:], plane), I64))
        chosen = mine if inside is None else ops.logical_and(inside, mine)
        return ops.where(chosen, broadcast_load(ops, grad, at, dtype), constant(ops, 0, dtype))

    return _reduce_windows(ctx, node, out, axes, "sum", dtype, sent)


def _max_pool_backward(ctx, node, grad, x, n, kernel_size, stride, padding, dilation, ceil_mode, indices):
    pools = _pools(to_exprs(node.meta["val"].shape), grad.size, n, kernel_size, stride, padding, dilation)
    return _gather_by_index(ctx, node, grad, indices, [p.covering_axis(exact=False) for p in pools],
                            any(p.candidates() > 1 for p in pools))


@_register("reduction", aten.max_pool2d_with_indices_backward.default)
def lower_max_pool2d_with_indices_backward(ctx, node, grad, x, *args):
    return _max_pool_backward(ctx, node, grad, x, 2, *args)


@_register("reduction", aten.max_pool3d_with_indices_backward.default)
def lower_max_pool3d_with_indices_backward(ctx, node, grad, x, *args):
    return _max_pool_backward(ctx, node, grad, x, 3, *args)


# --------------------------------------------------------------------------- adaptive pooling


def _adaptive_start(o: Expr, size: Expr, out: Expr) -> Expr:
    return _floor_div(o * size, out)


def _adaptive_end(o: Expr, size: Expr, out: Expr) -> Expr:
    return _floor_div((o + 1) * size + out - 1, out)  # ceil((o + 1) * size / out)


def _widest(size: Expr, out: Expr) -> tuple[Expr, bool]:
    """(the largest adaptive window from `size` elements to `out` points, whether they differ)."""
    if size.is_number and out.is_number:
        widths = {int(_adaptive_end(sympy.Integer(o), size, out) - _adaptive_start(sympy.Integer(o), size, out))
                  for o in range(int(out))} or {0}
        return sympy.Integer(max(widths)), len(widths) > 1
    return FloorDiv(size + out - 1, out) + 1, True


def _adaptive_axis(size: Expr, out: Expr) -> _Axis:
    """The adaptive window of output point ``o``: ``[floor(o*size/out), ceil((o+1)*size/out))``."""
    width, varies = _widest(size, out)

    def checks(o: Expr, r: Expr) -> list[tuple[Expr, Expr | None, Expr | None]]:
        return [(_adaptive_start(o, size, out) + r, None, _adaptive_end(o, size, out))] if varies else []

    return _Axis(size, width, lambda o, r: _adaptive_start(o, size, out) + r, checks, False, varies)


def _adaptive_covering_axis(size: Expr, out: Expr) -> _Axis:
    """The output points whose adaptive windows hold input coordinate ``i``: the windows
    ``[floor(o*size/out), ceil((o+1)*size/out))`` holding ``i`` are exactly the points
    ``[floor(i*out/size), ceil((i+1)*out/size))``."""
    return dataclasses.replace(_adaptive_axis(out, size), size=out)


def _window_lengths(sizes: Sequence[Expr], outs: Sequence[Expr], coords: Sequence[Expr]) -> list[Expr]:
    return [sympy.simplify(_adaptive_end(o, s, n) - _adaptive_start(o, s, n)) for s, n, o in zip(sizes, outs, coords)]


def _divide_each(ops: Any, value: Any, lengths: Sequence[Expr], dtype: torch.dtype) -> Any:
    """`value / lengths[0] / lengths[1] ...`, in eager's order of roundings."""
    for length in lengths:
        value = _divide(ops, value, length, dtype)
    return value


def _adaptive_avg_pool(ctx, node, x, n):
    out = node.meta["val"]
    sizes, outs = _spatial(x.size, n), _spatial(to_exprs(out.shape), n)
    axes = [_adaptive_axis(s, o) for s, o in zip(sizes, outs)]
    x = _reread(ctx, x, any(not _holds(sympy.Eq(sympy.Mod(s, o), 0)) for s, o in zip(sizes, outs)))
    dtype = compute_dtype(out.dtype)

    def window(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        at, inside, _ = _window_point(ops, axes, index, rindex)
        return _masked(ops, inside, broadcast_load(ops, x, at, dtype), 0, dtype)

    total = _reduce_windows(ctx, node, out, axes, "sum", dtype, window, store_dtype=dtype)

    def average(ops: Any, index: tuple[Expr, ...]) -> Any:
        lengths = _window_lengths(sizes, outs, index[len(index) - n:])
        return _divide_each(ops, total.load(ops, index), lengths, dtype)

    return Lazy(out.dtype, total.size, average, (node.name,), dtype if dtype != out.dtype else None)


@_register("reduction", aten._adaptive_avg_pool2d.default)
def lower_adaptive_avg_pool2d(ctx, node, x, output_size):
    return _adaptive_avg_pool(ctx, node, x, 2)


@_register("reduction", aten._adaptive_avg_pool3d.default)
def lower_adaptive_avg_pool3d(ctx, node, x, output_size):
    return _adaptive_avg_pool(ctx, node, x, 3)


def _adaptive_avg_pool_backward(ctx, node, grad, x, n):
    out = node.meta["val"]
    sizes, outs = _spatial(to_exprs(out.shape), n), _spatial(grad.size, n)
    axes = [_adaptive_covering_axis(s, o) for s, o in zip(sizes, outs)]
    grad = _reread(ctx, grad, any(not _holds(sympy.Eq(sympy.Mod(o, s), 0)) for s, o in zip(sizes, outs)))
    dtype = compute_dtype(out.dtype)

    def sent(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        at, inside, coords = _window_point(ops, axes, index, rindex)
        share = _divide_each(ops, broadcast_load(ops, grad, at, dtype), _window_lengths(sizes, outs, coords), dtype)
        return _masked(ops, inside, share, 0, dtype)

    return _reduce_windows(ctx, node, out, axes, "sum", dtype, sent)


@_register("reduction", aten._adaptive_avg_pool2d_backward.default)
def lower_adaptive_avg_pool2d_backward(ctx, node, grad, x):
    return _adaptive_avg_pool_backward(ctx, node, grad, x, 2)


@_register("reduction", aten._adaptive_avg_pool3d_backward.default)
def lower_adaptive_avg_pool3d_backward(ctx, node, grad, x):
    return _adaptive_avg_pool_backward(ctx, node, grad, x, 3)


def _adaptive_max_pool(ctx, node, x, n):
    sizes, outs = _spatial(x.size, n), _spatial(to_exprs(node.meta["val"][0].shape), n)
    return _max_with_indices(ctx, node, x, [_adaptive_axis(s, o) for s, o in zip(sizes, outs)])


@_register("reduction", aten.adaptive_max_pool2d.default)
def lower_adaptive_max_pool2d(ctx, node, x, output_size):
    return _adaptive_max_pool(ctx, node, x, 2)


@_register("reduction", aten.adaptive_max_pool3d.default)
def lower_adaptive_max_pool3d(ctx, node, x, output_size):
    return _adaptive_max_pool(ctx, node, x, 3)


def _adaptive_max_pool_backward(ctx, node, grad, x, indices, n):
    sizes, outs = _spatial(to_exprs(node.meta["val"].shape), n), _spatial(grad.size, n)
    return _gather_by_index(ctx, node, grad, indices, [_adaptive_covering_axis(s, o) for s, o in zip(sizes, outs)],
                            True)


@_register("reduction", aten.adaptive_max_pool2d_backward.default)
def lower_adaptive_max_pool2d_backward(ctx, node, grad, x, indices):
    return _adaptive_max_pool_backward(ctx, node, grad, x, indices, 2)


@_register("reduction", aten.adaptive_max_pool3d_backward.default)
def lower_adaptive_max_pool3d_backward(ctx, node, grad, x, indices):
    return _adaptive_max_pool_backward(ctx, node, grad, x, indices, 3)


# --------------------------------------------------------------------------- upsample_nearest


@dataclasses.dataclass(frozen=True)
class _Nearest:
    """Which input coordinate nearest upsampling reads for output coordinate ``o``, as eager's
    CPU kernels compute it (ATen/native/UpSample.h: `nearest_idx`, `nearest_exact_idx`):
    ``min(floor(o * scale), size - 1)`` in float32 (exact: ``floor(float((o + 0.5) * scale))``,
    the product in double), ``scale = float(1 / scales)`` when given, else ``float(size) / out``;
    legacy nearest copies when ``out == size`` and halves when ``out == 2 * size``.

    Where the float math gives what integer math on the sizes gives (checked for every ``o``
    when the sizes are static), it is written as integer index expressions."""

    size: Expr
    out: Expr
    scale: float | None  # the float32 scale; None when it depends on symbolic sizes
    exact: bool

    @staticmethod
    def of(size: Expr, out: Expr, scales: float | None, exact: bool) -> _Nearest:
        if scales is not None and scales > 0:
            scale = torch.tensor(1.0 / scales, dtype=torch.float64).float().item()
        elif size.is_number and out.is_number:
            scale = (torch.tensor(float(size)) / torch.tensor(float(out))).item()
        else:
            scale = None
        return _Nearest(size, out, scale, exact)

    def shortcut(self) -> int | None:
        """1 or 2 where eager's index is ``o`` or ``o // 2`` without float math."""
        for ratio in (1, 2):
            if not self.exact and _holds(sympy.Eq(self.out, ratio * self.size)):
                return ratio
        return 1 if self.exact and self.scale == 1.0 and _holds(sympy.Eq(self.out, self.size)) else None

    def source(self, ops: Any, o: Expr) -> Any:
        """The input coordinate read for `o`, as a float32 value (an integer below 2**24)."""
        f32, f64 = torch.float32, torch.float64
        scale = constant(ops, self.scale, f32) if self.scale is not None else \
            ops.truediv(ops.index_expr(self.size, f32), ops.index_expr(self.out, f32))
        if self.exact:
            shifted = ops.add(ops.index_expr(o, f64), constant(ops, 0.5, f64))
            position = ops.to_dtype(ops.mul(shifted, ops.to_dtype(scale, f64)), f32)
        else:
            position = ops.mul(ops.index_expr(o, f32), scale)
        return ops.minimum(ops.floor(position), ops.index_expr(self.size - 1, f32))

    def _integer(self, o: Expr) -> Expr:
        """``floor(o * size / out)`` (exact: ``floor((o + 0.5) * size / out)``)."""
        if self.exact:
            return _floor_div((2 * o + 1) * self.size, 2 * self.out)
        return _floor_div(o * self.size, self.out)

    def _first_reader(self, i: Expr) -> Expr:
        """The first ``o`` whose `_integer` is `i` or more."""
        if self.exact:
            return _floor_div(2 * i * self.out + self.size - 1, 2 * self.size)
        return _floor_div(i * self.out + self.size - 1, self.size)

    def _sources(self) -> torch.Tensor:
        """`source` of every output coordinate (static sizes), computed as the kernel does."""
        o = torch.arange(int(self.out))
        position = ((o.double() + 0.5) * self.scale).float() if self.exact else \
            o.float() * torch.tensor(self.scale, dtype=torch.float32)
        return position.floor().clamp(max=int(self.size) - 1).long()

    def is_integer(self) -> bool:
        """Whether `_integer` is eager's index for every ``o`` (static sizes only)."""
        if not (self.size.is_number and self.out.is_number and self.scale is not None):
            return False
        o = torch.arange(int(self.out))
        integer = (2 * o + 1) * int(self.size) // (2 * int(self.out)) if self.exact else o * int(self.size) // int(self.out)
        return bool(torch.equal(self._sources(), integer))

    def index(self, o: Expr) -> Expr | None:
        """The input coordinate read for `o` as an index expression, or None (float math)."""
        ratio = self.shortcut()
        if ratio is not None:
            return _floor_div(o, ratio)
        return self._integer(o) if self.is_integer() else None

    def covering_axis(self) -> tuple[_Axis, bool]:
        """(the output coordinates that may read input coordinate ``i``, whether the kernel must
        check with `source` which do). Those are ``[first(i), first(i + 1))`` where the index
        is integer math; else a window from ``floor(i * out / size) - margin`` as wide as the
        float math needs (checked against every ``o`` for static sizes; for symbolic ones, the
        float error moves a boundary by at most one)."""
        ratio = self.shortcut()
        if ratio is not None:
            return _Axis(self.out, sympy.Integer(ratio), lambda i, r: ratio * i + r), False
        size, out = self.size, self.out
        if self.is_integer():
            readers = [int(self._first_reader(sympy.Integer(i + 1)) - self._first_reader(sympy.Integer(i)))
                       for i in range(int(size))]
            varies = len(set(readers)) > 1

            def checks(i: Expr, r: Expr) -> list[tuple[Expr, Expr | None, Expr | None]]:
                return [(self._first_reader(i) + r, None, self._first_reader(i + 1))] if varies else []

            return _Axis(out, sympy.Integer(max(readers, default=1)), lambda i, r: self._first_reader(i) + r,
                         checks, False, varies), False
        if size.is_number and out.is_number:
            sources, o = self._sources(), torch.arange(int(out))
            ideal = sources * int(out) // int(size)
            margin = max(int((ideal - o).max()), 0) if len(o) else 0
            width: Expr = sympy.Integer(int((o - (ideal - margin).clamp(min=0)).max()) + 1 if len(o) else 1)
        elif self.scale is None:
            margin, width = 1, FloorDiv(out + size - 1, size) + 3
        else:
            raise NotImplementedError("upsample_nearest backward with symbolic sizes and explicit scales is not "
                                      "lowered (its windows depend on how the scales relate to the sizes)")

        def start(i: Expr) -> Expr:
            return sympy.Max(_floor_div(i * out, size) - margin, 0) if margin else _floor_div(i * out, size)

        return _Axis(out, width, lambda i, r: start(i) + r, lambda i, r: [(start(i) + r, None, out)],
                     False, True), True


def _nearest_dims(node, sizes: Sequence[Expr], outs: Sequence[Expr], scales: Sequence[float | None],
                  exact: bool) -> list[_Nearest]:
    return [_Nearest.of(s, o, sc, exact) for s, o, sc in zip(sizes, outs, scales)]


def _upsample_nearest(ctx, node, x, output_size, scales, exact: bool):
    out = node.meta["val"]
    n = len(output_size)
    nearest = _nearest_dims(node, _spatial(x.size, n), _spatial(to_exprs(out.shape), n), scales, exact)
    dtype = compute_dtype(out.dtype)

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        at = list(index[:len(index) - n])
        for m, o in zip(nearest, index[len(index) - n:]):
            read = m.index(o)
            at.append(read if read is not None else
                      ops.indirect_indexing(ops.to_dtype(m.source(ops, o), I64), m.size))
        return broadcast_load(ops, x, at, dtype)

    return Lazy(out.dtype, to_exprs(out.shape), inner, (node.name,), dtype if dtype != out.dtype else None)


def _upsample_nearest_backward(ctx, node, grad, output_size, input_size, scales, exact: bool):
    out = node.meta["val"]
    n = len(output_size)
    nearest = _nearest_dims(node, _spatial(to_exprs(out.shape), n), _spatial(grad.size, n), scales, exact)
    axes, float_checked = zip(*(m.covering_axis() for m in nearest))
    grad = _reread(ctx, grad, any(m.shortcut() is None for m in nearest))
    dtype = compute_dtype(out.dtype)

    def sent(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        at, inside, coords = _window_point(ops, axes, index, rindex)
        conds = [inside] if inside is not None else []
        for m, checked, i, o in zip(nearest, float_checked, index[len(index) - n:], coords):
            if checked:
                conds.append(ops.eq(m.source(ops, o), ops.index_expr(i, torch.float32)))
        return _masked(ops, _all(ops, conds), broadcast_load(ops, grad, at, dtype), 0, dtype)

    return _reduce_windows(ctx, node, out, axes, "sum", dtype, sent)


_SCALE_NAMES = {1: ("scales",), 2: ("scales_h", "scales_w"), 3: ("scales_d", "scales_h", "scales_w")}


def _register_nearest(op: Any, kind: str, n: int, exact: bool, backward: bool) -> None:
    def lower(ctx, node, x, output_size, *args, **kwargs):
        if backward:
            input_size, *args = args
        given = dict(zip(_SCALE_NAMES[n], args)) | kwargs
        scales = [given.get(name) for name in _SCALE_NAMES[n]]
        try:
            if backward:
                return _upsample_nearest_backward(ctx, node, x, output_size, input_size, scales, exact)
            return _upsample_nearest(ctx, node, x, output_size, scales, exact)
        except NotImplementedError as exc:
            raise LoweringError(f"{node_location(node)}: {exc}") from exc

    lower.__name__ = f"lower_{op._schema.name.removeprefix('aten::')}"
    _register(kind, op)(lower)


for _n in (1, 2, 3):
    for _exact, _prefix in ((False, "upsample_nearest"), (True, "_upsample_nearest_exact")):
        _register_nearest(getattr(aten, f"{_prefix}{_n}d").default, "pointwise", _n, _exact, False)
        _register_nearest(getattr(aten, f"{_prefix}{_n}d_backward").default, "reduction", _n, _exact, True)
