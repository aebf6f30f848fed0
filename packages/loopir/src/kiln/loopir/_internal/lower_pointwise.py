"""Lowerings of elementwise ATen ops to `Lazy` values (broadcasting and type promotion here)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx as fx

from .registry import Lowerings
from .sizes import Expr, to_exprs
from .sizes import compute_dtype as upcast
from .values import Lazy, StridedView

aten = torch.ops.aten
TABLE = Lowerings()


def broadcast_load(ops: Any, operand: Any, index: Sequence[Expr], dtype: torch.dtype) -> Any:
    """Read `operand` (a value, a Python scalar or a size expression) at a broadcast index."""
    if isinstance(operand, (StridedView, Lazy)):
        rank = len(operand.size)
        own = index[len(index) - rank:] if rank else ()
        own = tuple(sympy.Integer(0) if s == 1 else i for i, s in zip(own, operand.size))
        value = operand.load(ops, own)
        loaded = operand.value_dtype if isinstance(operand, Lazy) else operand.dtype
        return value if loaded == dtype else ops.to_dtype(value, dtype)
    if isinstance(operand, sympy.Expr) and not operand.is_number:
        return ops.index_expr(operand, dtype)
    return constant(ops, operand, dtype)


def constant(ops: Any, value: Any, dtype: torch.dtype) -> Any:
    """`ops.constant` with `value` converted to the Python type of `dtype` (as torch does when
    it casts a scalar operand), so handlers never see e.g. 2.5 as an int64 constant."""
    if isinstance(value, sympy.Expr):
        value = int(value) if value.is_Integer else float(value)
    if dtype == torch.bool:
        value = bool(value)
    elif not dtype.is_floating_point and math.isfinite(value):
        value = int(value)
        if dtype in SMALL_INTEGERS:  # wrapped into the dtype, as eager converts a scalar operand
            info = torch.iinfo(dtype)
            value = (value - info.min) % (info.max - info.min + 1) + info.min
    elif dtype.is_floating_point:
        value = float(value)
    return ops.constant(value, dtype)


def out_dtype_size(node: fx.Node) -> tuple[torch.dtype, tuple[Expr, ...]]:
    val = node.meta["val"]
    return val.dtype, to_exprs(val.shape)


def promoted_dtype(a: Any, b: Any) -> torch.dtype:
    """The dtype torch computes a comparison of `a` and `b` in (`torch.result_type` rules:
    dimensioned tensors over 0-d tensors over Python scalars, each only across categories)."""
    return torch.result_type(_promotion_probe(a), _promotion_probe(b))


def _promotion_probe(operand: Any) -> Any:
    """A stand-in with the promotion-relevant traits of `operand`: dtype and 0-d or not."""
    if isinstance(operand, (StridedView, Lazy)):
        return torch.empty((1,) if operand.size else (), dtype=operand.dtype)
    if isinstance(operand, sympy.Expr):
        return 1 if operand.is_integer else 1.0
    return operand


SMALL_INTEGERS = (torch.int8, torch.uint8, torch.int16)


def pointwise(node: fx.Node, fn: Callable[..., Any], *operands: Any,
              compute_dtype: torch.dtype | None = None) -> Lazy:
    """A Lazy value computing `fn(ops, *loaded_operands)` in `compute_dtype` at every index.

    Without `compute_dtype`, a bfloat16/float16 result is computed in float32 and stays a
    float32 value (rounded when stored: see `sizes.compute_dtype`); an explicit `compute_dtype`
    (a cast, a comparison in the promoted dtype) is used as given."""
    out_dtype, out_size = out_dtype_size(node)
    dtype = compute_dtype or upcast(out_dtype)

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        loaded = [broadcast_load(ops, o, index, dtype) for o in operands]
        result = fn(ops, *loaded)
        # int8/uint8/int16 results wrap where the op makes them, as in eager: a codegen may
        # compute them wider (C++ promotes them to int), so each one is converted back here
        wraps = out_dtype in SMALL_INTEGERS and dtype == out_dtype
        return result if dtype in (out_dtype, upcast(out_dtype)) and not wraps else ops.to_dtype(result, out_dtype)

    computed = dtype if dtype != out_dtype and dtype == upcast(out_dtype) else None
    return Lazy(out_dtype, out_size, inner, (node.name,), computed)


def _scaled(ops: Any, value: Any, alpha: Any, dtype: torch.dtype) -> Any:
    return value if alpha == 1 else ops.mul(value, constant(ops, alpha, dtype))


@TABLE.register("pointwise", aten.add.Tensor, aten.add.Scalar)
def lower_add(ctx, node, a, b, alpha=1):  # alpha is positional in the .Scalar overload
    dtype = node.meta["val"].dtype
    if dtype == torch.bool:  # True + True is True in eager: a logical or (a 1-bit add wraps)
        return pointwise(node, lambda ops, x, y: ops.logical_or(x, y) if alpha else x, a, b)
    return pointwise(node, lambda ops, x, y: ops.add(x, _scaled(ops, y, alpha, dtype)), a, b)


@TABLE.register("pointwise", aten.sub.Tensor, aten.sub.Scalar)
def lower_sub(ctx, node, a, b, alpha=1):
    dtype = node.meta["val"].dtype
    return pointwise(node, lambda ops, x, y: ops.sub(x, _scaled(ops, y, alpha, dtype)), a, b)


@TABLE.register("pointwise", aten.div.Tensor, aten.div.Scalar)
def lower_div(ctx, node, a, b):
    return pointwise(node, lambda ops, x, y: ops.truediv(x, y), a, b)


def _binary(op_name: str):
    def lower(ctx, node, a, b):
        return pointwise(node, lambda ops, x, y: getattr(ops, op_name)(x, y), a, b)

    lower.__name__ = f"lower_{op_name}"
    return lower


for _op_name, _overloads in {
    "mul": (aten.mul.Tensor, aten.mul.Scalar),
    "maximum": (aten.maximum.default,),
    "minimum": (aten.minimum.default,),
    "pow": (aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor),
}.items():
    TABLE.register("pointwise", *_overloads)(_binary(_op_name))


def _unary(op_name: str):
    def lower(ctx, node, a):
        return pointwise(node, lambda ops, x: getattr(ops, op_name)(x), a)

    lower.__name__ = f"lower_{op_name}"
    return lower


for _op_name in ("neg", "exp", "log", "sigmoid", "tanh", "relu", "abs", "sqrt", "rsqrt", "reciprocal",
                 "erf", "expm1", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
                 "acosh", "atanh", "erfc", "erfinv", "lgamma", "exp2", "log2", "log10"):
    TABLE.register("pointwise", getattr(aten, _op_name).default)(_unary(_op_name))

for _op_name, _overloads in {
    "atan2": (aten.atan2.default,), "hypot": (aten.hypot.default,), "nextafter": (aten.nextafter.default,),
    "copysign": (aten.copysign.Tensor, aten.copysign.Scalar), "fmod": (aten.fmod.Tensor, aten.fmod.Scalar),
    "remainder": (aten.remainder.Tensor, aten.remainder.Scalar), "gcd": (aten.gcd.default,),
}.items():
    TABLE.register("pointwise", *_overloads)(_binary(_op_name))


def _floating_only(op_name: str):
    """Rounding functions: the identity on integer tensors, as in torch."""
    def lower(ctx, node, a):
        if not node.meta["val"].dtype.is_floating_point:
            return pointwise(node, lambda ops, x: x, a)
        return pointwise(node, lambda ops, x: getattr(ops, op_name)(x), a)

    lower.__name__ = f"lower_{op_name}"
    return lower


for _op_name in ("ceil", "floor", "trunc", "round"):
    TABLE.register("pointwise", getattr(aten, _op_name).default)(_floating_only(_op_name))


@TABLE.register("pointwise", aten.round.decimals)
def lower_round_decimals(ctx, node, a, *, decimals=0):
    # Scale by 10**|decimals| in the tensor's dtype, round half to even, scale back (as torch).
    dtype = node.meta["val"].dtype
    if decimals == 0 or not dtype.is_floating_point:
        return _floating_only("round")(ctx, node, a)

    def fn(ops, x):
        scale = constant(ops, 10.0 ** abs(decimals), dtype)
        if decimals > 0:
            return ops.truediv(ops.round(ops.mul(x, scale)), scale)
        return ops.mul(ops.round(ops.truediv(x, scale)), scale)

    return pointwise(node, fn, a)


@TABLE.register("pointwise", aten.sign.default)
def lower_sign(ctx, node, a):
    if node.meta["val"].dtype == torch.bool:
        return pointwise(node, lambda ops, x: x, a)
    return pointwise(node, lambda ops, x: ops.sign(x), a)


def _predicate(op_name: str, integer_result: bool | None):
    """isnan/isinf/signbit: computed in the input's dtype (bfloat16/float16: float32, which
    keeps NaN, infinities and signs); on integers a constant or `x < 0`."""
    def lower(ctx, node, a):
        if a.dtype.is_floating_point:
            return pointwise(node, lambda ops, x: getattr(ops, op_name)(x), a, compute_dtype=upcast(a.dtype))
        if integer_result is not None:
            return pointwise(node, lambda ops: constant(ops, integer_result, torch.bool))
        return pointwise(node, lambda ops, x: ops.lt(x, constant(ops, 0, a.dtype)), a, compute_dtype=a.dtype)

    lower.__name__ = f"lower_{op_name}"
    return lower


TABLE.register("pointwise", aten.isnan.default)(_predicate("isnan", False))
TABLE.register("pointwise", aten.isinf.default)(_predicate("isinf", False))
TABLE.register("pointwise", aten.signbit.default)(_predicate("signbit", None))


def _nan_ignoring(op_name: str, integer_op: str):
    def lower(ctx, node, a, b):
        name = op_name if node.meta["val"].dtype.is_floating_point else integer_op
        return pointwise(node, lambda ops, x, y: getattr(ops, name)(x, y), a, b)

    lower.__name__ = f"lower_{op_name}"
    return lower


TABLE.register("pointwise", aten.fmax.default)(_nan_ignoring("fmax", "maximum"))
TABLE.register("pointwise", aten.fmin.default)(_nan_ignoring("fmin", "minimum"))


@TABLE.register("pointwise", aten.lcm.default)
def lower_lcm(ctx, node, a, b):
    # |a / gcd * b|, 0 when both are 0 (dividing by 1 there: both branches of a where run).
    dtype = node.meta["val"].dtype

    def fn(ops, x, y):
        g = ops.gcd(x, y)
        zero = ops.eq(g, constant(ops, 0, dtype))
        divisor = ops.where(zero, constant(ops, 1, dtype), g)
        return ops.where(zero, constant(ops, 0, dtype), ops.abs(ops.mul(ops.truncdiv(x, divisor), y)))

    return pointwise(node, fn, a, b)


@TABLE.register("pointwise", aten.div.Tensor_mode, aten.div.Scalar_mode)
def lower_div_mode(ctx, node, a, b, *, rounding_mode=None):
    out_dtype = node.meta["val"].dtype
    if rounding_mode == "trunc" and upcast(out_dtype) != out_dtype:
        # eager's bfloat16/float16 kernel truncates the quotient rounded to the dtype:
        # trunc(bf16(53.9)) = 54, where truncating the float32 quotient gives 53
        def trunc_of_rounded_quotient(ops, x, y):
            quotient = ops.to_dtype(ops.to_dtype(ops.truediv(x, y), out_dtype), upcast(out_dtype))
            return ops.trunc(quotient)

        return pointwise(node, trunc_of_rounded_quotient, a, b)
    name = {None: "truediv", "trunc": "truncdiv", "floor": "floordiv"}[rounding_mode]
    return pointwise(node, lambda ops, x, y: getattr(ops, name)(x, y), a, b)


@TABLE.register("pointwise", aten.pow.Scalar)
def lower_pow_scalar(ctx, node, base, exponent):
    return pointwise(node, lambda ops, x, y: ops.pow(x, y), base, exponent)


@TABLE.register("pointwise", aten.ldexp.Tensor)
def lower_ldexp(ctx, node, a, b):
    # a * 2**b, exact for integer b (as torch computes it: a * pow(2, b)).
    return pointwise(node, lambda ops, x, y: ops.mul(x, ops.exp2(y)), a, b)


def _logical(op_name: str):
    def lower(ctx, node, *operands):
        return pointwise(node, lambda ops, *xs: getattr(ops, op_name)(*xs), *operands, compute_dtype=torch.bool)

    lower.__name__ = f"lower_{op_name}"
    return lower


for _op_name in ("logical_and", "logical_or", "logical_xor"):
    TABLE.register("pointwise", getattr(aten, _op_name).default)(_logical(_op_name))


def _bitwise(op_name: str, bool_op: str):
    """Bitwise ops on integers; on bool tensors the logical op (C++ would promote `~b` to int)."""
    def lower(ctx, node, *operands):
        name = bool_op if node.meta["val"].dtype == torch.bool else op_name
        return pointwise(node, lambda ops, *xs: getattr(ops, name)(*xs), *operands)

    lower.__name__ = f"lower_{op_name}"
    return lower


for _op_name, _bool_op, _overloads in (
    ("bitwise_and", "logical_and", (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)),
    ("bitwise_or", "logical_or", (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)),
    ("bitwise_xor", "logical_xor", (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)),
    ("bitwise_not", "logical_not", (aten.bitwise_not.default,)),
    ("left_shift", None, (aten.bitwise_left_shift.Tensor,)),
    ("right_shift", None, (aten.bitwise_right_shift.Tensor,)),
):
    TABLE.register("pointwise", *_overloads)(_bitwise(_op_name, _bool_op))


def _comparison(op_name: str):
    def lower(ctx, node, a, b):
        return pointwise(node, lambda ops, x, y: getattr(ops, op_name)(x, y), a, b,
                         compute_dtype=promoted_dtype(a, b))

    lower.__name__ = f"lower_{op_name}"
    return lower


for _op_name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _packet = getattr(aten, _op_name)
    TABLE.register("pointwise", _packet.Tensor, _packet.Scalar)(_comparison(_op_name))


@TABLE.register("pointwise", aten.logical_not.default)
def lower_logical_not(ctx, node, a):
    return pointwise(node, lambda ops, x: ops.logical_not(x), a, compute_dtype=torch.bool)


@TABLE.register("pointwise", aten.where.self)
def lower_where(ctx, node, cond, a, b):
    dtype = node.meta["val"].dtype
    out_dtype, out_size = out_dtype_size(node)

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        c = broadcast_load(ops, cond, index, torch.bool)
        return ops.where(c, broadcast_load(ops, a, index, dtype), broadcast_load(ops, b, index, dtype))

    return Lazy(out_dtype, out_size, inner, (node.name,))


@TABLE.register("pointwise", aten.clone.default, aten._to_copy.default, aten.lift_fresh_copy.default)
def lower_copy(ctx, node, a, **kwargs):
    device = kwargs.get("device")
    if device is not None and torch.device(device) != node.args[0].meta["val"].device:
        raise NotImplementedError("device-changing _to_copy is not lowered")
    return pointwise(node, lambda ops, x: x, a, compute_dtype=node.meta["val"].dtype)


@TABLE.register("constant", aten.scalar_tensor.default, aten.full.default)
def lower_full(ctx, node, *args, **kwargs):
    value = args[-1]
    return pointwise(node, lambda ops, x: x, value)


@TABLE.register("constant", aten.full_like.default)
def lower_full_like(ctx, node, x, fill_value, **kwargs):
    # decomp turns full_like into full (+ permute) where x's layout is static; with symbolic
    # strides it stays whole, and where it is stored (an output) it gets x's layout from its
    # FakeTensor, as any value (`eager_strides`)
    return pointwise(node, lambda ops, v: v, fill_value)
