"""Explicit vector code for a kernel's innermost loops, on kiln's SIMD layer (`vector_layer.py`).

`CppVectorHandler` emits loop bodies that handle KILN_LANES consecutive values of a loop
variable (`lane_var`) at once: the innermost loop of a pointwise kernel, and a reduction
kernel's row loops and reduction loops (one accumulator per lane, folded after the loop).
Loads and stores contiguous in that variable become vector loads and stores, loads that do not
depend on it stay scalar (loop-invariant values, broadcast with `kiln::splat` where a vector
op needs them), and every op maps to a vector op or to kiln's vector math. It tracks the dtype of each value, since the C++ it writes names vector
types and conversions explicitly.

What it cannot write as vectors raises `NotVectorizable` with the reason: a gather (an index
that is not the loop variable plus an invariant offset), an op without a vector version, a
run-time check. The caller then keeps the scalar loop and says why in a comment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from kiln.loopir import OPS, Kernel, index_vars

from .kernel_source import CppHandler, c_type
from .low_precision import (
    LOW_PRECISION,
    from_storage,
    vector_from_storage,
    vector_round_to,
    vector_to_storage,
)
from .printer import cpp_expr
from .vector_reduction_source import (
    start_lanewise_reduction,
    start_vector_reduction,
)
from .vector_segments import decide_comparison, resolve_clamps


class NotVectorizable(Exception):
    """A kernel's innermost loop cannot be written as vector code; the message says why."""


# The vector type of a value of each dtype (bfloat16/float16 values are float32 lanes that hold
# numbers the dtype represents; they are 16-bit lanes only in memory, see low_precision.py).
VECTOR_TYPES = {torch.float32: "kiln::vf32", torch.float64: "kiln::vf64", torch.int32: "kiln::vi32",
                torch.int64: "kiln::vi64", torch.bool: "kiln::vmask", torch.bfloat16: "kiln::vf32",
                torch.float16: "kiln::vf32"}
_FLOAT = (torch.float32, torch.float64)
_INT = (torch.int32, torch.int64)
_NUMERIC = _FLOAT + _INT
# Ops exact on bfloat16/float16 values (their result needs no rounding); loopir computes the
# others in float32.
_EXACT = (*_NUMERIC, *LOW_PRECISION)
_FLOAT32_LANES = (torch.float32, *LOW_PRECISION)

# op -> (vector template, operand dtypes it accepts, result dtype: None = the operands')
_UNARY: dict[str, tuple[str, tuple[torch.dtype, ...], torch.dtype | None]] = {
    "identity": ("{0}", (*_EXACT, torch.bool), None),
    "neg": ("(-{0})", _EXACT, None),
    "abs": ("kiln::abs({0})", _EXACT, None),
    "relu": ("kiln::relu({0})", _EXACT, None),
    "logical_not": ("(~{0})", (torch.bool,), None),
    "bitwise_not": ("(~{0})", (*_INT, torch.bool), None),
    "isnan": ("kiln::mask({0} != {0})", (*_FLOAT, *LOW_PRECISION), torch.bool),
    **{name: (f"kiln::{name}({{0}})", _FLOAT, None) for name in (
        "exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "sigmoid", "sin", "cos", "sqrt", "rsqrt",
        "reciprocal", "floor", "ceil", "trunc")},
    "round": ("kiln::round_even({0})", _FLOAT, None),
    "erf": ("kiln::erf({0})", (torch.float32,), None),  # float64 erf has no vector version yet
}
_BINARY: dict[str, tuple[str, tuple[torch.dtype, ...], torch.dtype | None]] = {
    "add": ("({0} + {1})", _NUMERIC, None), "sub": ("({0} - {1})", _NUMERIC, None),
    "mul": ("({0} * {1})", _NUMERIC, None), "truediv": ("({0} / {1})", _FLOAT, None),
    "maximum": ("kiln::maximum({0}, {1})", _EXACT, None), "minimum": ("kiln::minimum({0}, {1})", _EXACT, None),
    "copysign": ("kiln::copysign({0}, {1})", (*_FLOAT, *LOW_PRECISION), None),
    **{name: (f"kiln::mask({{0}} {op} {{1}})", _EXACT, torch.bool)
       for name, op in (("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))},
    **{name: (f"kiln::mask({{0}} {op} {{1}})", (*_EXACT, torch.bool), torch.bool)
       for name, op in (("eq", "=="), ("ne", "!="))},
    **{name: (f"({{0}} {op} {{1}})", (torch.bool,), None)
       for name, op in (("logical_and", "&"), ("logical_or", "|"), ("logical_xor", "^"))},
    **{name: (f"({{0}} {op} {{1}})", (*_INT, torch.bool), None)
       for name, op in (("bitwise_and", "&"), ("bitwise_or", "|"), ("bitwise_xor", "^"))},
}
# The dtype of a scalar (loop-invariant) result, by op; other ops keep their first operand's.
_BOOL_RESULTS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not",
                 "isnan", "isinf", "signbit"}
_SPECIAL = {"load", "store", "store_reduction", "reduction", "constant", "index_expr", "to_dtype", "where",
            "indirect_indexing", "pow"}


class CppVectorHandler(CppHandler):
    """Emits loop bodies over `lane_var` in steps of KILN_LANES (see the module docstring);
    with no lane variable (the statements of a reduction kernel's outer loops), scalar code.
    Values are variable names; `types` maps each to (dtype, whether it is a vector). Vector
    loads and stores move `active` elements: a constant KILN_LANES in a loop's whole-vector
    iterations, fewer in its tail."""

    def __init__(self, kernel: Kernel, across_outputs: bool = False, strided_loads: bool = False,
                 lane_loop: sympy.Symbol | None = None, lane_range: tuple[int, int] | None = None) -> None:
        super().__init__(kernel)
        self.lane_var: sympy.Symbol | None = None
        # The outer loop that is vector code (where one is): the innermost, unless the caller
        # reorders the loops of a pointwise kernel.
        self.lane_loop = lane_loop if lane_loop is not None else (index_vars(len(kernel.ranges)) or [None])[-1]
        # The lanes are the kernel's innermost outer variable everywhere, reductions included:
        # each lane reduces for its own output (a reduction over an outer dim).
        self.across_outputs = across_outputs
        # Whether loads may move with the lanes by a stride other than 1 (lane by lane; where
        # the caller tiles the loops), and whether one does.
        self.allow_strided = strided_loads
        self.strided_loads = False
        # The part [lo, hi) of the lane loop these statements run on (vector_segments.py):
        # Min/Max of the lane variable decided there are resolved; `breakpoints` collects where
        # the undecided ones change branch.
        self.lane_range = lane_range
        self.breakpoints: set[int] = set()
        # Where the caller split the lane loop: each segment's [lo, hi) and statements.
        self.lane_segments: list[tuple[int, int, list[str]]] = []
        self.index_values: dict[str, sympy.Expr] = {}  # variable -> the index expression it holds
        self.types: dict[str, tuple[torch.dtype, bool]] = {}
        self.definitions: dict[str, str] = {}  # variable -> its expression, in order (vector_hoist.py)
        inner = max([len(kernel.row_ranges), *(len(n.reduction_ranges) for n in kernel.nodes)])
        # what an index may use; anything else is an indirect index
        self.loop_symbols = {*index_vars(len(kernel.ranges)), *index_vars(inner, "r"), *kernel.symbols}
        self._lane_invariant_check = False  # a lane-invariant index's bounds check is being added

    def var(self, text: str) -> str:
        name = super().var(text)
        self.definitions.setdefault(name, text)
        return name

    def typed(self, text: str, dtype: torch.dtype, vector: bool) -> str:
        name = self.var(text)
        self.types[name] = (dtype, vector)
        return name

    def is_vector(self, name: str) -> bool:
        return self.types[name][1]

    def dtype(self, name: str) -> torch.dtype:
        return self.types[name][0]

    def broadcast(self, name: str) -> str:
        """`name` as a vector: itself, or a scalar splat into every lane."""
        if self.is_vector(name):
            return name
        dtype = self.dtype(name)
        if dtype == torch.bool:
            return self.typed(f"kiln::splat<kiln::vmask>(-static_cast<int32_t>({name}))", dtype, True)
        return self.typed(f"kiln::splat<{VECTOR_TYPES[dtype]}>({name})", dtype, True)

    def add_check(self, error: type[Exception], message: str, size: sympy.Expr | None = None) -> int:
        if self._lane_invariant_check:
            return super().add_check(error, message, size)
        raise NotVectorizable(f"a run-time check ({message.split(':')[-1].strip()})")

    # -- addressing --------------------------------------------------------------------------
    def _on_lanes(self, index: sympy.Expr) -> sympy.Expr:
        """`index` with the clamps that the lane range decides resolved."""
        if self.lane_range is None or self.lane_var is None:
            return index
        resolved, points = resolve_clamps(index, self.lane_var, *self.lane_range)
        self.breakpoints |= points
        return resolved

    def _lane_stride(self, name: str, index: sympy.Expr) -> sympy.Expr:
        """How far `index` moves from one lane to the next: 0 (loop-invariant), 1 (contiguous)
        or another stride that does not depend on the lanes."""
        index = sympy.expand(sympy.sympify(index))
        free = index.free_symbols
        if not free <= self.loop_symbols:
            raise NotVectorizable(f"indirect (gather) access to {name}")
        if self.lane_var is None or self.lane_var not in free:
            return sympy.Integer(0)
        stride = index.coeff(self.lane_var)
        if self.lane_var in sympy.expand(index - stride * self.lane_var).free_symbols or \
                self.lane_var in stride.free_symbols:
            raise NotVectorizable(f"non-contiguous access to {name} (index {index})")
        return stride

    def _lane_offset(self, name: str, index: sympy.Expr) -> bool:
        """Whether `index` moves with the lanes (contiguous: True) or not at all (False)."""
        stride = self._lane_stride(name, index)
        if stride not in (0, 1):
            raise NotVectorizable(f"non-contiguous access to {name} (index {index})")
        return stride == 1

    def _address(self, name: str, index: sympy.Expr) -> tuple[str, sympy.Expr]:
        """The array `name` is read or written through, and the index in it."""
        if name in self.row_temporaries:
            self.row_temporary_index(name, index)  # raises unless it is read where it was stored
            return f"row_{name}", self.row_place(name)
        return (f"out_{name}" if name in self.produced else f"in_{name}"), index

    def load(self, name: str, index: sympy.Expr) -> str:
        local = self.local(name)
        if local is not None:
            return local
        dtype = self.buffer_dtypes[name]
        if dtype not in VECTOR_TYPES:
            raise NotVectorizable(f"{name} is {dtype}")
        array, index = self._address(name, self._on_lanes(index))
        stored = dtype in LOW_PRECISION and name not in self.row_temporaries  # scratch rows hold floats
        stride = self._lane_stride(name, index)
        if stride not in (0, 1) and not stored and self.allow_strided:  # a transposed read: lane by lane (2-D tiles keep it cached)
            self.strided_loads = True
            text = f"kiln::load_strided({array} + {cpp_expr(index)}, {cpp_expr(stride)}, active)"
            return self.typed(text, dtype, True)
        if self._lane_offset(name, index):
            text = f"kiln::load({array} + {cpp_expr(index)}, active)"
            return self.typed(vector_from_storage(dtype, text) if stored else text, dtype, True)
        text = f"{array}[{cpp_expr(index)}]"
        return self.typed(from_storage(dtype, text) if stored else text, dtype, False)

    def store(self, name: str, index: sympy.Expr, value: str) -> None:
        if self.dtype(value) != self.buffer_dtypes[name]:
            raise NotVectorizable(f"{name} stores a {self.dtype(value)} value")
        if self.lane_var is None:
            if self.is_vector(value):
                raise NotVectorizable(f"a vector stored outside a vector loop ({name})")
            super().store(name, index, value)
            return
        array, index = self._address(name, self._on_lanes(index))
        stride = self._lane_stride(name, index)
        dtype = self.buffer_dtypes[name]
        if stride not in (0, 1) and self.allow_strided and dtype not in LOW_PRECISION and \
                name not in self.row_temporaries:
            value = self.broadcast(value)
            if self.keep(name, value):
                self.strided_loads = True  # a transposed write: lane by lane, in 2-D tiles
                self.lines.append(f"kiln::store_strided({array} + {cpp_expr(index)}, {cpp_expr(stride)}, "
                                  f"{value}, active);")
            return
        if not self._lane_offset(name, index):
            raise NotVectorizable(f"every lane stores to one element of {name}")
        value = self.broadcast(value)
        if self.keep(name, value) or name in self.row_temporaries:
            dtype = self.buffer_dtypes[name]
            if dtype in LOW_PRECISION and name not in self.row_temporaries:
                value = vector_to_storage(dtype, self.unrounded.get(value, (value,))[0])
            self.lines.append(f"kiln::store({array} + {cpp_expr(index)}, {value}, active);")

    def reduction(self, name: str, reduction_type: str, dtype: torch.dtype, value: Any) -> str:
        if self.lane_var is None:
            raise NotVectorizable(f"a {reduction_type} reduction")
        value = tuple(map(self.broadcast, value)) if isinstance(value, tuple) else self.broadcast(value)
        if isinstance(value, tuple) and self.dtype(value[1]) != torch.int64:
            raise NotVectorizable(f"a {reduction_type} reduction with {self.dtype(value[1])} positions")
        if self.across_outputs:
            pending = start_lanewise_reduction(name, reduction_type, c_type(dtype), value, self.end_loop_body())
        else:
            ranges = self.node.reduction_ranges  # one static dim: a row whose length the code may use
            length = int(ranges[0]) if len(ranges) == 1 and sympy.sympify(ranges[0]).is_Integer else None
            pending = start_vector_reduction(name, reduction_type, c_type(dtype), value, self.end_loop_body(), length)
        if pending is None:
            raise NotVectorizable(f"a {reduction_type} reduction of {dtype}")
        self.pending_reduction = pending
        self.lines.extend(pending.finish)
        self.types[pending.result] = (torch.int64 if isinstance(value, tuple) else dtype, self.across_outputs)
        if not self.across_outputs:
            self.lane_var = None  # what follows runs once, after the loop
        return pending.result

    def store_reduction(self, name: str, index: sympy.Expr, value: str) -> None:
        self.store(name, index, value)

    def indirect_indexing(self, value: str, size: sympy.Expr) -> sympy.Symbol:
        """An index that is one value for every lane (an embedding row: `weight[ids[i], j]` with
        the lanes along j) is computed and checked as scalar code once per vector step, and the
        loads through it stay contiguous vector loads; an index that differs between lanes is a
        gather, left to the scalar loop."""
        if self.lane_var is None or self.is_vector(value) or not sympy.sympify(size).is_positive:
            raise NotVectorizable("indirect indexing (a gather)")
        self._lane_invariant_check = True
        try:
            symbol = super().indirect_indexing(value, size)
        finally:
            self._lane_invariant_check = False
        self.loop_symbols.add(symbol)  # constant across the lanes: an index may use it
        return symbol

    # -- values ------------------------------------------------------------------------------
    def constant(self, value: Any, dtype: torch.dtype) -> str:
        name = super().constant(value, dtype)
        self.types[name] = (dtype, False)
        return name

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> str:
        expr = sympy.expand(self._on_lanes(sympy.sympify(expr)))
        if self.lane_var not in expr.free_symbols:
            name = super().index_expr(expr, dtype)
            self.types[name] = (dtype, False)
            self.index_values[name] = expr
            return name
        if dtype in LOW_PRECISION:
            return self.to_dtype(self.index_expr(expr, torch.float32), dtype)
        step = expr.coeff(self.lane_var)
        start = sympy.expand(expr - step * self.lane_var)
        if dtype not in _NUMERIC or not step.is_Integer or self.lane_var in start.free_symbols:
            raise NotVectorizable(f"index expression {expr} as {dtype}")
        name = self.typed(f"kiln::ramp<{VECTOR_TYPES[dtype]}>({cpp_expr(expr)}, {int(step)})", dtype, True)
        self.index_values[name] = expr
        return name

    def to_dtype(self, x: str, dtype: torch.dtype) -> str:
        source = self.dtype(x)
        if not self.is_vector(x):
            name = super().to_dtype(x, dtype)
            self.types[name] = (dtype, False)
            return name
        if dtype not in VECTOR_TYPES:
            raise NotVectorizable(f"a conversion to {dtype}")
        if source == dtype:
            return x
        if dtype in LOW_PRECISION:  # float32 lanes rounded to the dtype
            lanes = x if source in _FLOAT32_LANES else self.to_dtype(x, torch.float32)
            name = self.typed(vector_round_to(dtype, lanes), dtype, True)
            self.unrounded[name] = (lanes, dtype)
            return name
        if source in LOW_PRECISION and dtype == torch.float32:  # already float32 lanes
            return self.typed(x, dtype, True)
        if dtype == torch.bool:
            return self.typed(f"kiln::mask({x} != 0)", dtype, True)
        if source == torch.bool:
            return self.typed(f"kiln::from_mask<{VECTOR_TYPES[dtype]}>({x})", dtype, True)
        return self.typed(f"__builtin_convertvector({x}, {VECTOR_TYPES[dtype]})", dtype, True)

    def where(self, cond: str, a: str, b: str) -> str:
        decided = self.constant_value(cond)
        if self.lane_range is not None and isinstance(decided, bool) and self.dtype(a) == self.dtype(b):
            return a if decided else b  # decided on this segment of the lane loop
        if self.lane_var is None:
            return self.typed(f"({cond} ? {a} : {b})", self.dtype(a), False)
        if self.dtype(a) != self.dtype(b) or self.dtype(cond) != torch.bool:
            raise NotVectorizable(f"where over {self.dtype(a)} and {self.dtype(b)}")
        mask, a, b = self.broadcast(cond), self.broadcast(a), self.broadcast(b)
        if self.dtype(a) == torch.bool:
            return self.typed(f"(({mask} & {a}) | (~{mask} & {b}))", torch.bool, True)
        text = f"kiln::select({mask}, {a}, {b})"
        return self.typed(text, self.dtype(a), True)

    def pow(self, base: str, exponent: str) -> str:
        if self.lane_var is None or not (self.is_vector(base) or self.is_vector(exponent)):
            name = self._scalar(lambda: CppHandler.pow(self, base, exponent))
            self.types[name] = (self.dtype(base), False)
            return name
        value = self.constant_value(exponent)
        dtype = self.dtype(base)
        if not self.is_vector(exponent) and dtype in _FLOAT and value in _VECTOR_POW:
            return self.typed(_VECTOR_POW[value].format(self.broadcast(base)), dtype, True)
        if dtype != torch.float32 or self.dtype(exponent) != dtype:
            raise NotVectorizable(f"pow of {dtype} with a {self.dtype(exponent)} exponent")
        return self.typed(f"kiln::pow({self.broadcast(base)}, {self.broadcast(exponent)})", dtype, True)

    def _scalar(self, emit: Callable[[], str]) -> str:
        """The scalar statement `emit` writes; inside a vector loop its variable is named
        `inv<n>`: a loop-invariant value (the regression guard allows scalar math there)."""
        prefix = self.prefix
        if self.lane_var is not None:
            self.prefix = "inv"
        try:
            return emit()
        finally:
            self.prefix = prefix

    def _decided_comparison(self, op: str, args: tuple[str, ...]) -> bool | None:
        """The value of a comparison of index expressions (or a logical op on such values) that
        the lane range decides, or None; where it changes inside the range is a breakpoint."""
        if self.lane_range is None or self.lane_var is None:
            return None
        known = [self.constant_value(a) for a in args]
        if op in _LOGICAL and all(isinstance(k, bool) for k in known):
            return _LOGICAL[op](*known)
        if len(args) != 2 or not all(a in self.index_values for a in args):
            return None
        a, b = (self.index_values[a] for a in args)
        decided, points = decide_comparison(op, a, b, self.lane_var, *self.lane_range)
        self.breakpoints |= points
        return decided

    def apply(self, op: str, args: tuple[str, ...]) -> str:
        """A unary or binary op: a vector op inside a vector loop (loop-invariant operands
        broadcast), scalar code outside one or when no operand is a vector: a loop-invariant
        value is computed once as a scalar (GCC hoists it out of the loop), then broadcast
        where a vector op uses it, not recomputed in every lane of every iteration."""
        decided = self._decided_comparison(op, args)
        if decided is not None:
            return self.constant(decided, torch.bool)
        if self.lane_var is None or not any(self.is_vector(a) for a in args):
            name = self._scalar(lambda: getattr(CppHandler, op)(self, *args))
            dtype = torch.bool if op in _BOOL_RESULTS else self.dtype(args[0])
            self.types[name] = (dtype, False)
            return name
        template, accepted, result = (_UNARY if len(args) == 1 else _BINARY).get(op, (None, (), None))
        dtypes = {self.dtype(a) for a in args}
        if template is None:
            raise NotVectorizable(f"{op} has no vector version")
        if len(dtypes) != 1 or not dtypes <= set(accepted):
            raise NotVectorizable(f"{op} of {', '.join(sorted(str(d) for d in dtypes))}")
        operands = [self.broadcast(a) for a in args]
        return self.typed(template.format(*operands), result or dtypes.pop(), True)


_LOGICAL = {"logical_and": lambda a, b: a and b, "logical_or": lambda a, b: a or b,
            "logical_not": lambda a: not a}
_VECTOR_POW = {2: "({0} * {0})", 3: "({0} * {0} * {0})", 0.5: "kiln::sqrt({0})", -0.5: "kiln::rsqrt({0})",
               -1: "kiln::reciprocal({0})", -2: "kiln::reciprocal({0} * {0})"}


def _install_vector_ops() -> None:
    for op in OPS:
        if op in _SPECIAL:
            continue

        def method(self: CppVectorHandler, *args: str, _op: str = op) -> str:
            return self.apply(_op, args)

        method.__name__ = op
        setattr(CppVectorHandler, op, method)


_install_vector_ops()


def _scalar_only(op: str):
    def method(self: CppVectorHandler, *args: Any) -> str:
        raise NotVectorizable(f"{op} has no vector version")

    method.__name__ = op
    return method


for _op in ("rand", "randn", "randint64", "scan"):  # random numbers and scans run as scalar code
    setattr(CppVectorHandler, _op, _scalar_only(_op))

