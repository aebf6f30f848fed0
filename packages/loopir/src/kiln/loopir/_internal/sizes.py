"""Sizes and index expressions as sympy expressions (dynamic shapes are first-class).

Sizes coming from FakeTensors may be plain ints or SymInts; both become sympy expressions
here. Index variables are non-negative integer symbols: `i0, i1, ...` iterate the output
of a loop nest, `r0, r1, ...` its reduction dimensions.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch

Expr = sympy.Expr


class FloorDiv(sympy.Function):
    """Integer floor division of non-negative index expressions (C `/` on them agrees)."""

    is_integer = True

    @classmethod
    def eval(cls, base, divisor):
        if divisor == 1:
            return base
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if base == divisor:
            return sympy.Integer(1)
        if not divisor.is_Integer:
            # an exact quotient of products: torch's view meta spells a size `(s0**2)//s0`
            # (group_norm's decomposition), which must read as the `s0` it equals for layouts
            # and sizes to compare equal
            quotient = base / divisor
            if sympy.fraction(quotient)[1] == 1 and quotient.is_integer:
                return quotient
        return None


LOW_PRECISION = (torch.bfloat16, torch.float16)
SUPPORTED_DTYPES = frozenset({torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                              torch.int16, torch.int8, torch.uint8, torch.bool})


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype loop bodies compute a value of `dtype` in: float32 for bfloat16 and float16
    (loads upcast, math in float32, rounding to the storage dtype only on store, as Inductor
    does), the dtype itself otherwise."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def to_expr(size: int | torch.SymInt | Expr) -> Expr:
    """An int, SymInt or sympy expression as a sympy expression in loopir's vocabulary."""
    if isinstance(size, torch.SymInt):
        return from_torch_sympy(sympy.sympify(size.node.expr))
    return sympy.sympify(size)


def from_torch_sympy(expr: Expr) -> Expr:
    """Rewrite the sympy functions torch's ShapeEnv uses (its own FloorDiv, Mod, Max, ...) into
    the few loopir handles: `FloorDiv`, `sympy.Mod`, `sympy.Max`/`Min` and `sympy.Pow`. They
    are matched by name so no private torch module is imported; others are left as they are
    (and rejected, by name, where an expression is evaluated)."""
    if expr.is_Atom:
        return expr
    args = [from_torch_sympy(a) for a in expr.args]
    name = type(expr).__name__
    if name in ("FloorDiv", "CleanDiv"):
        return FloorDiv(*args)
    if name == "CeilDiv":
        return FloorDiv(args[0] + args[1] - 1, args[1])
    if name in ("Mod", "PythonMod"):
        return sympy.Mod(*args)
    if name == "ModularIndexing":
        return sympy.Mod(FloorDiv(args[0], args[1]), args[2])
    if name in ("Max", "Min"):
        return (sympy.Max if name == "Max" else sympy.Min)(*args)
    if name == "PowByNatural":
        return sympy.Pow(*args)
    if name == "Identity":
        return args[0]
    return expr.func(*args)


def to_exprs(sizes: Sequence[int | torch.SymInt]) -> tuple[Expr, ...]:
    return tuple(to_expr(s) for s in sizes)


def index_vars(n: int, prefix: str = "i") -> tuple[sympy.Symbol, ...]:
    return tuple(sympy.Symbol(f"{prefix}{k}", integer=True, nonnegative=True) for k in range(n))


def indirect_var(n: int) -> sympy.Symbol:
    """The symbol `ops.indirect_indexing` returns: an index the loop body computed at run time."""
    return sympy.Symbol(f"ind{n}", integer=True)


def contiguous_strides(size: Sequence[Expr]) -> tuple[Expr, ...]:
    strides: list[Expr] = []
    running: Expr = sympy.Integer(1)
    for s in reversed(size):
        strides.append(running)
        running = running * s
    return tuple(reversed(strides))


def flat_index(index: Sequence[Expr], stride: Sequence[Expr], offset: Expr = 0) -> Expr:
    return sympy.expand(sympy.sympify(offset) + sum((i * s for i, s in zip(index, stride)), sympy.Integer(0)))


def numel(size: Sequence[Expr]) -> Expr:
    return sympy.Mul(*size) if size else sympy.Integer(1)


def same_exprs(a: Sequence[Expr], b: Sequence[Expr]) -> bool:
    return len(a) == len(b) and all(sympy.simplify(x - y) == 0 for x, y in zip(a, b))


def unflatten(flat: Expr, size: Sequence[Expr]) -> tuple[Expr, ...]:
    """Index into a contiguous tensor of `size` from a flat position `flat`."""
    strides = contiguous_strides(size)
    out = []
    for dim, (s, st) in enumerate(zip(size, strides)):
        q = FloorDiv(flat, st)
        out.append(q if dim == 0 else sympy.Mod(q, s))
    return tuple(out)


def free_size_symbols(exprs: Sequence[Expr]) -> set[sympy.Symbol]:
    """Symbols of sizes (not index variables) appearing in `exprs`."""
    found: set[sympy.Symbol] = set()
    for e in exprs:
        for s in sympy.sympify(e).free_symbols:
            if not _is_index_var(s):
                found.add(s)
    return found


def _is_index_var(s: sympy.Symbol) -> bool:
    """Loop variables (`i0`, `r0`) and indirect indices (`ind0`), as opposed to size symbols."""
    return (s.name[:1] in ("i", "r") and s.name[1:].isdigit()) or (s.name[:3] == "ind" and s.name[3:].isdigit())


def evaluate_expr(expr: Expr, bindings: dict[sympy.Symbol, int]) -> int:
    """Value of a size expression once every symbol is bound to an int."""
    value = sympy.sympify(expr).xreplace({k: sympy.Integer(v) for k, v in bindings.items()})
    if not value.is_Integer:
        value = sympy.simplify(value)
    if not value.is_Integer:
        raise ValueError(f"size expression {expr} did not evaluate to an integer (got {value})")
    return int(value)
