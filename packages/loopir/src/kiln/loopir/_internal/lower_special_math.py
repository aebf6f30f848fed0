"""Numeric building blocks for special functions written as loop bodies.

`Real` is one floating-point value of a loop body with Python's arithmetic operators: each
operator emits one op on the handler, and Python numbers become constants of the value's dtype
(rounded to it, as a C++ `T(literal)` is). So a Cephes formula reads as it does in aten's
Math.h, e.g. ``(x * x - 5.783185962946784) * rp / rq``. Comparisons give a `Cond`, which
`where` selects with. Branches become `where` selections of values computed on every lane (a
loop body has no control flow), and loops are unrolled a fixed number of times, each step
predicated on the loop's condition.

`special_pointwise` turns a function of `Real`s into a `Lazy` value of an ATen node, with
torch's type promotion of special functions (integers and bools compute in the default float
dtype, bfloat16/float16 in float32).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from .lower_pointwise import constant, pointwise
from .sizes import compute_dtype as upcast
from .values import Lazy

Number = int | float


class Cond:
    """A bool value of a loop body; ``&``, ``|`` and ``~`` are logical and, or, not."""

    __slots__ = ("ops", "value")

    def __init__(self, ops: Any, value: Any) -> None:
        self.ops, self.value = ops, value

    def __and__(self, other: Cond) -> Cond:
        return Cond(self.ops, self.ops.logical_and(self.value, other.value))

    def __or__(self, other: Cond) -> Cond:
        return Cond(self.ops, self.ops.logical_or(self.value, other.value))

    def __invert__(self) -> Cond:
        return Cond(self.ops, self.ops.logical_not(self.value))


class Real:
    """A floating-point value of a loop body (see the module docstring)."""

    __slots__ = ("ops", "value", "dtype")

    def __init__(self, ops: Any, value: Any, dtype: torch.dtype) -> None:
        self.ops, self.value, self.dtype = ops, value, dtype

    def const(self, number: Number) -> Real:
        """`number` as a constant of this value's dtype."""
        return Real(self.ops, constant(self.ops, number, self.dtype), self.dtype)

    def _operand(self, other: Real | Number) -> Any:
        if isinstance(other, Real):
            if other.dtype != self.dtype:
                raise TypeError(f"special-function arithmetic mixes {self.dtype} and {other.dtype}")
            return other.value
        return constant(self.ops, other, self.dtype)

    def _binary(self, name: str, other: Real | Number, reverse: bool = False) -> Real:
        a, b = self.value, self._operand(other)
        return Real(self.ops, getattr(self.ops, name)(*((b, a) if reverse else (a, b))), self.dtype)

    def __add__(self, other: Real | Number) -> Real:
        return self._binary("add", other)

    def __radd__(self, other: Number) -> Real:
        return self._binary("add", other, reverse=True)

    def __sub__(self, other: Real | Number) -> Real:
        return self._binary("sub", other)

    def __rsub__(self, other: Number) -> Real:
        return self._binary("sub", other, reverse=True)

    def __mul__(self, other: Real | Number) -> Real:
        return self._binary("mul", other)

    def __rmul__(self, other: Number) -> Real:
        return self._binary("mul", other, reverse=True)

    def __truediv__(self, other: Real | Number) -> Real:
        return self._binary("truediv", other)

    def __rtruediv__(self, other: Number) -> Real:
        return self._binary("truediv", other, reverse=True)

    def __neg__(self) -> Real:
        return Real(self.ops, self.ops.neg(self.value), self.dtype)

    def _compare(self, name: str, other: Real | Number) -> Cond:
        return Cond(self.ops, getattr(self.ops, name)(self.value, self._operand(other)))

    def __lt__(self, other: Real | Number) -> Cond:
        return self._compare("lt", other)

    def __le__(self, other: Real | Number) -> Cond:
        return self._compare("le", other)

    def __gt__(self, other: Real | Number) -> Cond:
        return self._compare("gt", other)

    def __ge__(self, other: Real | Number) -> Cond:
        return self._compare("ge", other)

    def eq(self, other: Real | Number) -> Cond:
        return self._compare("eq", other)

    def ne(self, other: Real | Number) -> Cond:
        return self._compare("ne", other)

    def pow(self, exponent: Real | Number) -> Real:
        return self._binary("pow", exponent)

    def copysign(self, sign: Real | Number) -> Real:
        return self._binary("copysign", sign)

    def apply(self, name: str) -> Real:
        """The unary op `name` (`ops.exp`, `ops.lgamma`, ...) of this value."""
        return Real(self.ops, getattr(self.ops, name)(self.value), self.dtype)

    def exp(self) -> Real:
        return self.apply("exp")

    def log(self) -> Real:
        return self.apply("log")

    def sqrt(self) -> Real:
        return self.apply("sqrt")

    def abs(self) -> Real:
        return self.apply("abs")

    def isinf(self) -> Cond:
        return Cond(self.ops, self.ops.isinf(self.value))

    def to(self, dtype: torch.dtype) -> Real:
        return self if dtype == self.dtype else Real(self.ops, self.ops.to_dtype(self.value, dtype), dtype)


def never(like: Real) -> Cond:
    """The constant False (a `done` flag before the first step of an unrolled loop)."""
    return Cond(like.ops, like.ops.constant(False, torch.bool))


def where(cond: Cond, a: Real | Number, b: Real | Number) -> Real:
    """`a` where `cond` holds, else `b` (one of them must be a `Real`: it gives the dtype)."""
    like = a if isinstance(a, Real) else b
    if not isinstance(like, Real):
        raise TypeError("where() needs a Real operand to know the dtype")
    return Real(like.ops, like.ops.where(cond.value, like._operand(a), like._operand(b)), like.dtype)


def select(default: Real | Number, *cases: tuple[Cond, Real | Number]) -> Real:
    """The value of the first case whose condition holds, else `default` (an if/else-if chain:
    cases are listed in the order the C++ tests them)."""
    result = default
    for cond, value in reversed(cases):
        result = where(cond, value, result)
    if not isinstance(result, Real):
        raise TypeError("select() needs a Real operand to know the dtype")
    return result


def polevl(x: Real, coefficients: Sequence[float]) -> Real:
    """Cephes' polevl: the polynomial with `coefficients` (highest degree first) at `x`, by Horner."""
    result = x.const(coefficients[0])
    for c in coefficients[1:]:
        result = result * x + c
    return result


def chbevl(x: Real, coefficients: Sequence[float]) -> Real:
    """Cephes' chbevl: the Chebyshev series with `coefficients` (highest order first) at `x`
    (Clenshaw's recurrence, in Math.h's order of operations)."""
    b0, b1, b2 = x.const(coefficients[0]), x.const(0.0), x.const(0.0)
    for c in coefficients[1:]:
        b2, b1 = b1, b0
        b0 = x * b1 - b2 + c
    return 0.5 * (b0 - b2)


def float_dtype(node: fx.Node) -> torch.dtype:
    """The dtype a special function of `node` computes in: its result's (floating, as torch
    promotes integer inputs), bfloat16/float16 computing in float32."""
    return upcast(node.meta["val"].dtype)


def special_pointwise(node: fx.Node, fn: Callable[..., Real], *operands: Any,
                      dtype: torch.dtype | None = None) -> Lazy:
    """A Lazy value computing ``fn(*reals)`` at each index: each operand (a value or a Python
    number, broadcast) loaded as a `Real` of `dtype` (default: `float_dtype(node)`), the
    result converted to the node's dtype."""
    dtype = dtype or float_dtype(node)

    def body(ops: Any, *loaded: Any) -> Any:
        result = fn(*(Real(ops, value, dtype) for value in loaded))
        if result.dtype != dtype:
            raise TypeError(f"{fn.__name__} computed a {result.dtype} value, expected {dtype}")
        return result.value

    return pointwise(node, body, *operands, compute_dtype=dtype)
