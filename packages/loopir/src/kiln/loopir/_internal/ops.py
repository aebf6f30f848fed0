"""The ops-handler protocol: the vocabulary every loop body is written in.

A loop body (`inner_fn`) never computes anything itself. It calls methods on a handler that it
is given, e.g. ``ops.add(ops.load("buf0", i), ops.constant(1.0, torch.float32))``. Swapping the
handler gives a different meaning to the same body: `ReadsWrites` collects the buffers and
index expressions a body touches, `Printer` renders it as text, the reference evaluator in
`evaluate.py` computes it with torch, and each codegen emits source code.

`OPS` is the complete protocol: operation name -> number of value operands. Each handler is
checked against it by a completeness test; a handler that lacks an operation raises
`UnknownOpError` rather than inventing a default.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy
import torch

from .sizes import indirect_var

# name -> number of *value* operands (dtype/index/name arguments are not counted).
UNARY = (
    "neg", "exp", "log", "sigmoid", "tanh", "relu", "abs", "sqrt", "rsqrt", "reciprocal",
    "erf", "expm1", "log1p",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "erfc", "erfinv", "lgamma", "exp2", "log2", "log10",
    "ceil", "floor", "trunc", "round",  # round: half to even
    "sign", "signbit", "isnan", "isinf",
    "logical_not", "bitwise_not", "identity",
)
BINARY = (
    "add", "sub", "mul", "truediv", "maximum", "minimum", "pow",
    # floordiv/truncdiv/remainder/fmod: exact on integers; floordiv and remainder round
    # toward -inf (Python's // and %), truncdiv and fmod toward zero (C's / and %).
    "floordiv", "truncdiv", "remainder", "fmod",
    "atan2", "hypot", "copysign", "nextafter", "fmax", "fmin",  # fmax/fmin ignore NaNs
    "gcd",  # integers; never negative
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    # shifts by a negative or too large amount give what torch gives: 0, or the sign fill
    "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
)
OPS: dict[str, int] = {
    **{name: 1 for name in UNARY},
    **{name: 2 for name in BINARY},
    "where": 3,
    "to_dtype": 1,  # to_dtype(x, dtype)
    "constant": 0,  # constant(value, dtype)
    "index_expr": 0,  # index_expr(sympy_expr, dtype)
    # indirect_indexing(value, size) -> a sympy symbol standing for `value` (an integer
    # computed by the body, e.g. loaded from an index tensor; negative values wrap by `size`)
    # that later `load` indices may use: how gather/index_select read at data-dependent places.
    "indirect_indexing": 1,
    "load": 0,  # load(buffer_name, flat_index)
    "store": 1,  # store(buffer_name, flat_index, value)
    # reduction(buffer_name, reduction_type, dtype, value) -> accumulator. For "argmax"/"argmin"
    # `value` is a pair (value, position): the result is the int64 position of the first
    # largest/smallest value (NaN counts as largest and smallest, as in torch), `dtype` the
    # dtype the values compare in. For "welford" the result is the triple (mean, m2, weight) of
    # the values, each in `dtype`: their mean, the sum of their squared deviations from it, and
    # their count (over no values: NaN, 0, 0), from one pass over them (see ir.Welford).
    "reduction": 1,
    "store_reduction": 1,  # store_reduction(buffer_name, flat_index, accumulator)
    # scan(buffer_name, scan_type, dtype, value) -> the inclusive scan of `value` along the
    # node's scan loop (a `Scan` node's r0), at the current position, combined in `dtype`;
    # the body stores it at every position (`store`). For "argmax"/"argmin", `value` is a pair
    # (value, position) and the result the int64 position of the running max/min, the latest
    # one on ties, a NaN counting as larger and smaller than everything (cummax's indices).
    "scan": 1,
    # Counter-based random numbers (philox.py defines them exactly): `seed` an int64 value (a
    # load of the graph's seed buffer), `offset` an int64 value (which number of the stream).
    # Equal arguments give equal results, so a body may be replayed or inlined twice.
    "rand": 2,  # rand(seed, offset) -> float32 uniform in [0, 1)
    "randn": 2,  # randn(seed, offset) -> float32 standard normal
    "randint64": 4,  # randint64(seed, offset, low, high) -> int64 uniform in [low, high)
    # scatter(buffer_name, flat_index, value, mode): an indirect store of a `Scatter` node into
    # its own buffer (which starts as a copy of the node's `base`): "store" writes `value`, the
    # others combine it with the element there (one of SCATTER_MODES; see ir.Scatter).
    "scatter": 1,
}
RANDOM = ("rand", "randn", "randint64")

REDUCTION_TYPES = ("sum", "prod", "max", "min", "argmax", "argmin", "welford")
WELFORD_STATISTICS = ("mean", "m2", "weight")  # the order of a "welford" reduction's triple
# max/min propagate NaN (cummax/cummin); logaddexp is log(exp(a) + exp(b)) (logcumsumexp)
SCAN_TYPES = ("sum", "prod", "max", "min", "logaddexp", "argmax", "argmin")
# store: the value replaces the element (duplicate indices: one of them, unspecified, as eager);
# sum/prod: added/multiplied in (bool: or/and); max/min: NaN propagates (scatter_reduce's amax/amin)
SCATTER_MODES = ("store", "sum", "prod", "max", "min")


class UnknownOpError(NotImplementedError):
    """A handler was asked for an operation it does not implement."""


class OpsHandler:
    """Base class: every operation in `OPS` raises until a subclass defines it."""

    def __getattr__(self, name: str) -> Any:
        if name in OPS:
            raise UnknownOpError(f"{type(self).__name__} does not implement ops.{name}")
        raise AttributeError(f"ops.{name} is not part of the loopir ops protocol (see OPS)")


def missing_ops(handler_type: type) -> list[str]:
    """Names in `OPS` that `handler_type` does not define (for completeness tests)."""
    return [name for name in OPS if not any(name in vars(k) for k in handler_type.__mro__[:-1]
                                            if k is not OpsHandler)]


@dataclasses.dataclass(frozen=True, slots=True)
class Access:
    """One load or store made by a loop body: which buffer, at which flat index."""

    buffer: str
    index: sympy.Expr
    kind: str  # "load" | "store"


class ReadsWrites(OpsHandler):
    """Analysis handler: records every buffer access; values are opaque placeholders."""

    def __init__(self) -> None:
        self.accesses: list[Access] = []
        self.index_exprs: list[sympy.Expr] = []  # arguments of ops.index_expr (size symbols in values)
        self.indirect_count = 0

    def _value(self, *args: Any, **kwargs: Any) -> None:
        return None

    def load(self, name: str, index: sympy.Expr) -> None:
        self.accesses.append(Access(name, sympy.sympify(index), "load"))

    def store(self, name: str, index: sympy.Expr, value: Any) -> None:
        self.accesses.append(Access(name, sympy.sympify(index), "store"))

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> None:
        self.accesses.append(Access(name, sympy.sympify(index), "store"))

    def reduction(self, name: str, reduction_type: str, dtype: torch.dtype, value: Any) -> Any:
        return (None,) * len(WELFORD_STATISTICS) if reduction_type == "welford" else None

    def scan(self, name: str, scan_type: str, dtype: torch.dtype, value: Any) -> None:
        return None

    def scatter(self, name: str, index: sympy.Expr, value: Any, mode: str) -> None:
        self.accesses.append(Access(name, sympy.sympify(index), "store"))

    def constant(self, value: Any, dtype: torch.dtype) -> None:
        return None

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> None:
        self.index_exprs.append(sympy.sympify(expr))

    def to_dtype(self, x: Any, dtype: torch.dtype) -> None:
        return None

    def where(self, cond: Any, a: Any, b: Any) -> None:
        return None

    def indirect_indexing(self, value: Any, size: sympy.Expr) -> sympy.Symbol:
        self.index_exprs.append(sympy.sympify(size))
        self.indirect_count += 1
        return indirect_var(self.indirect_count - 1)

    @property
    def reads(self) -> list[Access]:
        return [a for a in self.accesses if a.kind == "load"]

    @property
    def writes(self) -> list[Access]:
        return [a for a in self.accesses if a.kind == "store"]


for _name in UNARY + BINARY + RANDOM:
    setattr(ReadsWrites, _name, ReadsWrites._value)


class Printer(OpsHandler):
    """Renders a loop body as one readable line per operation (used by `str(Kernel)`)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _emit(self, text: str) -> str:
        name = f"t{len(self.lines)}"
        self.lines.append(f"{name} = {text}")
        return name

    def load(self, name: str, index: sympy.Expr) -> str:
        return self._emit(f"load({name}, {index})")

    def store(self, name: str, index: sympy.Expr, value: str) -> str:
        return self._emit(f"store({name}, {index}, {value})")

    def store_reduction(self, name: str, index: sympy.Expr, value: str) -> str:
        return self._emit(f"store({name}, {index}, {value})")

    def reduction(self, name: str, reduction_type: str, dtype: torch.dtype, value: Any) -> str:
        value = ", ".join(value) if isinstance(value, tuple) else value
        result = self._emit(f"reduce_{reduction_type}({value})")
        if reduction_type == "welford":
            return tuple(f"{result}.{statistic}" for statistic in WELFORD_STATISTICS)
        return result

    def scan(self, name: str, scan_type: str, dtype: torch.dtype, value: Any) -> str:
        value = ", ".join(value) if isinstance(value, tuple) else value
        return self._emit(f"scan_{scan_type}({value})")

    def scatter(self, name: str, index: sympy.Expr, value: str, mode: str) -> str:
        return self._emit(f"scatter_{mode}({name}, {index}, {value})")

    def constant(self, value: Any, dtype: torch.dtype) -> str:
        return self._emit(f"constant({value!r}, {str(dtype).removeprefix('torch.')})")

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> str:
        return self._emit(f"index_expr({expr}, {str(dtype).removeprefix('torch.')})")

    def to_dtype(self, x: str, dtype: torch.dtype) -> str:
        return self._emit(f"to_dtype({x}, {str(dtype).removeprefix('torch.')})")

    def where(self, cond: str, a: str, b: str) -> str:
        return self._emit(f"where({cond}, {a}, {b})")

    def indirect_indexing(self, value: str, size: sympy.Expr) -> sympy.Symbol:
        symbol = indirect_var(sum(line.startswith("ind") for line in self.lines))
        self.lines.append(f"{symbol} = indirect_indexing({value}, {size})")
        return symbol


def _printer_op(name: str):
    def op(self: Printer, *args: str) -> str:
        return self._emit(f"{name}({', '.join(args)})")

    op.__name__ = name
    return op


for _name in UNARY + BINARY + RANDOM:
    setattr(Printer, _name, _printer_op(_name))
