"""Lowerings of random-number ops (rand, randn, randint, bernoulli, uniform, normal, exponential
and their ``*_like`` forms) on kiln's counter-based generator (`philox.py`).

Each op is a `Lazy` value: element ``p`` (its flat position in the op's output) is
``ops.rand(seed, start + p)`` (or `randn`/`randint64`), where ``seed`` is the graph's seed
buffer, drawn from torch's generator once per call, and ``start`` is the op's own stream
(`LoweringContext.random_stream`). The same seed and offset always give the same number, so a
random value may be inlined into several consumers or recomputed and stays one draw: fusion
never changes what a program samples. Training graphs keep a dropout mask computed in the
forward and saved for the backward (the min-cut partitioner never recomputes random ops).

Numbers are float32 (24 random bits) whatever the output dtype, as in Inductor; int64 draws
have 63 random bits. Explicit `generator=` arguments are refused: their state is not torch's
default generator, which the seed is drawn from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from . import philox
from .lower import LoweringError, node_location
from .lower_pointwise import broadcast_load, constant
from .registry import Lowerings
from .sizes import Expr, compute_dtype, contiguous_strides, flat_index, numel, to_exprs
from .values import Lazy

aten = torch.ops.aten
TABLE = Lowerings()
I64 = torch.int64
F32 = torch.float32

# fill(ops, seed, offset, index) -> the element's value, in the output's compute dtype
Fill = Callable[[Any, Any, Any, tuple[Expr, ...]], Any]


def _random(ctx: Any, node: Any, fill: Fill, generator: Any = None) -> Lazy:
    if generator is not None:
        raise LoweringError(f"random ops with an explicit generator= are not lowered (kiln draws its seed from "
                            f"torch's default generator): {node_location(node)}")
    val = node.meta["val"]
    size = to_exprs(val.shape)
    count = numel(size)
    if count.is_Integer and int(count) > 1 << philox.STREAM_SHIFT:
        raise LoweringError(f"a random op draws at most 2**{philox.STREAM_SHIFT} numbers, this one "
                            f"{int(count)}: {node_location(node)}")
    seed_view, start = ctx.random_stream(val.device)
    strides = contiguous_strides(size)

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        seed = ops.load(seed_view.buffer, sympy.Integer(0))
        offset = ops.index_expr(flat_index(index, strides), I64)
        if start:
            offset = ops.add(offset, ops.constant(start, I64))
        return fill(ops, seed, offset, index)

    computed = compute_dtype(val.dtype)
    return Lazy(val.dtype, size, inner, (node.name,), computed if computed != val.dtype else None)


def _as(ops: Any, value: Any, have: torch.dtype, dtype: torch.dtype) -> Any:
    return value if have == dtype else ops.to_dtype(value, dtype)


def _uniform(node: Any, low: Any = 0.0, high: Any = 1.0) -> Fill:
    """``low + (high - low) * u`` for u uniform in [0, 1), in the output's compute dtype."""
    dtype = compute_dtype(node.meta["val"].dtype)

    def fill(ops: Any, seed: Any, offset: Any, index: tuple[Expr, ...]) -> Any:
        u = _as(ops, ops.rand(seed, offset), F32, dtype)
        if (low, high) == (0.0, 1.0):
            return u
        scaled = ops.mul(u, constant(ops, float(high) - float(low), dtype))
        return ops.add(scaled, constant(ops, low, dtype))

    return fill


def _normal(node: Any, mean: Any = 0.0, std: Any = 1.0) -> Fill:
    """``mean + std * z`` for z standard normal; `mean` and `std` numbers or tensors."""
    dtype = compute_dtype(node.meta["val"].dtype)

    def fill(ops: Any, seed: Any, offset: Any, index: tuple[Expr, ...]) -> Any:
        z = _as(ops, ops.randn(seed, offset), F32, dtype)
        if not (isinstance(std, (int, float)) and std == 1):
            z = ops.mul(z, broadcast_load(ops, std, index, dtype))
        if isinstance(mean, (int, float)) and mean == 0:
            return z
        return ops.add(z, broadcast_load(ops, mean, index, dtype))

    return fill


def _integers(node: Any, low: Any, high: Any) -> Fill:
    """Integers uniform in [low, high), as the output's dtype (float outputs hold whole numbers)."""
    dtype = compute_dtype(node.meta["val"].dtype)

    def fill(ops: Any, seed: Any, offset: Any, index: tuple[Expr, ...]) -> Any:
        draw = ops.randint64(seed, offset, broadcast_load(ops, low, index, I64), broadcast_load(ops, high, index, I64))
        return _as(ops, draw, I64, dtype)

    return fill


def _bernoulli(node: Any, p: Any) -> Fill:
    """1 with probability `p` (a number or a tensor read at the element), else 0."""
    dtype = compute_dtype(node.meta["val"].dtype)

    def fill(ops: Any, seed: Any, offset: Any, index: tuple[Expr, ...]) -> Any:
        # compared in float32 at least, as eager's CPU kernel compares a float draw with p
        cmp = torch.promote_types(dtype, F32)
        hit = ops.lt(_as(ops, ops.rand(seed, offset), F32, cmp), broadcast_load(ops, p, index, cmp))
        return ops.to_dtype(hit, dtype)

    return fill


def _check_range(node: Any, low: Any, high: Any) -> None:
    if isinstance(low, (int, float)) and isinstance(high, (int, float)) and not low < high:
        raise LoweringError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}: "
                            f"{node_location(node)}")


@TABLE.register("pointwise", aten.rand.default, aten.rand_like.default)
def lower_rand(ctx, node, *args, generator=None, **kwargs):
    return _random(ctx, node, _uniform(node), generator)


@TABLE.register("pointwise", aten.randn.default, aten.randn_like.default)
def lower_randn(ctx, node, *args, generator=None, **kwargs):
    return _random(ctx, node, _normal(node), generator)


@TABLE.register("pointwise", aten.randint.default, aten.randint_like.default)
def lower_randint_high(ctx, node, first, second, *rest, generator=None, **kwargs):
    # randint(high, size) and randint_like(self, high): low is 0
    high = first if node.target is aten.randint.default else second
    _check_range(node, 0, high)
    return _random(ctx, node, _integers(node, 0, high), generator)


@TABLE.register("pointwise", aten.randint.low, aten.randint_like.low_dtype)
def lower_randint_low(ctx, node, first, *args, generator=None, **kwargs):
    # randint.low(low, high, size) and randint_like.low_dtype(self, low, high)
    low, high = (first, args[0]) if node.target is aten.randint.low else (args[0], args[1])
    _check_range(node, low, high)
    return _random(ctx, node, _integers(node, low, high), generator)


@TABLE.register("pointwise", aten.uniform.default)
def lower_uniform(ctx, node, x, low=0.0, high=1.0, *, generator=None):
    return _random(ctx, node, _uniform(node, low, high), generator)


@TABLE.register("pointwise", aten.normal_functional.default)
def lower_normal_functional(ctx, node, x, mean=0.0, std=1.0, *, generator=None):
    return _random(ctx, node, _normal(node, mean, std), generator)


@TABLE.register("pointwise", aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def lower_normal(ctx, node, mean, std=1.0, *, generator=None):
    return _random(ctx, node, _normal(node, mean, std), generator)


@TABLE.register("pointwise", aten.bernoulli.default)
def lower_bernoulli(ctx, node, p, *, generator=None):
    return _random(ctx, node, _bernoulli(node, p), generator)


@TABLE.register("pointwise", aten.bernoulli.p)
def lower_bernoulli_p(ctx, node, x, p=0.5, *, generator=None):
    return _random(ctx, node, _bernoulli(node, p), generator)


@TABLE.register("pointwise", aten.exponential.default)
def lower_exponential(ctx, node, x, lambd=1.0, *, generator=None):
    dtype = compute_dtype(node.meta["val"].dtype)

    def fill(ops: Any, seed: Any, offset: Any, index: tuple[Expr, ...]) -> Any:
        # -log(1 - u) / lambd; u < 1, so the result is finite and >= 0
        u = _as(ops, ops.rand(seed, offset), F32, dtype)
        return ops.truediv(ops.neg(ops.log1p(ops.neg(u))), constant(ops, lambd, dtype))

    return _random(ctx, node, fill, generator)
