"""Size expressions evaluated on the host, without generating or `eval`-ing Python source.

A codegen's runtime needs sizes at call time: output shapes, expected input layouts, the
bound a failed index check names. `SizeFunction` compiles sympy expressions over size symbols
once into a tree of small closures, then evaluates it with each call's symbol values.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from ..sizes import FloorDiv

Compiled = Callable[[Sequence[int]], Any]
MEMO_SIZE = 64  # distinct symbol values a SizeFunction remembers its rows for (dynamic shapes)

_FOLDS = {sympy.Add: operator.add, sympy.Mul: operator.mul, sympy.Max: max, sympy.Min: min}


def compile_size(expr: Any, params: Sequence[sympy.Symbol]) -> Compiled:
    """`expr` as a function of the values of `params` (in order). Raises NotImplementedError
    naming the expression when it uses anything but integers, `params`, +, *, `FloorDiv`,
    `Mod`, Max, Min, Abs and positive integer powers."""
    expr = sympy.sympify(expr)
    position = {p: k for k, p in enumerate(params)}
    return _compile(expr, position, expr)


def _compile(expr: sympy.Expr, position: dict[sympy.Symbol, int], whole: sympy.Expr) -> Compiled:
    if expr.is_Integer:
        value = int(expr)
        return lambda values: value
    if isinstance(expr, sympy.Symbol):
        if expr not in position:
            raise NotImplementedError(f"size expression {whole} uses {expr}, which is not given at run time")
        k = position[expr]
        return lambda values: values[k]
    args = [_compile(a, position, whole) for a in expr.args]
    for kind, fold in _FOLDS.items():
        if isinstance(expr, kind):
            def folded(values: Sequence[int], args=args, fold=fold) -> Any:
                result = args[0](values)
                for arg in args[1:]:
                    result = fold(result, arg(values))
                return result
            return folded
    if isinstance(expr, (FloorDiv, sympy.Mod)):
        divide = operator.floordiv if isinstance(expr, FloorDiv) else operator.mod
        base, divisor = args
        return lambda values: divide(base(values), divisor(values))
    if isinstance(expr, sympy.Abs):  # torch's shape env writes a few sizes with it (u0 + Abs(u0))
        (operand,) = args
        return lambda values: abs(operand(values))
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        base, exponent = args[0], int(expr.exp)
        return lambda values: base(values) ** exponent
    raise NotImplementedError(f"cannot evaluate size expression {whole} on the host: {expr} is not an "
                              "integer operation loopir uses")


class SizeFunction:
    """Symbol values -> one tuple of ints per row of size expressions.

    ``SizeFunction(kernel.symbols, [o.size for o in kernel.outputs])(*values)`` gives each
    output's shape. Rows are remembered for the last `MEMO_SIZE` distinct symbol values, so a
    kernel called again with the same sizes pays one dict lookup. With ``unknown_as_none=True`` an expression that uses a symbol outside
    `params` evaluates to None (a size the caller does not constrain) instead of raising.
    """

    __slots__ = ("_complex", "_constants", "_known", "_memo", "_rows", "params")

    def __init__(self, params: Sequence[sympy.Symbol], rows: Sequence[Sequence[Any]],
                 unknown_as_none: bool = False) -> None:
        self.params = tuple(params)
        known = set(self.params)
        position = {p: k for k, p in enumerate(self.params)}
        # Each call lays out one tuple: the symbol values, then the values known now, then
        # the values of the other expressions; each row is a C-level getter over it.
        constants: list[Any] = []
        complex_: list[Compiled] = []
        slots: list[list[tuple[str, int]]] = []
        for row in rows:
            slots.append([])
            for expr in map(sympy.sympify, row):
                if unknown_as_none and not expr.free_symbols <= known:
                    slots[-1].append(("constant", len(constants)))
                    constants.append(None)
                elif expr.is_Integer:
                    slots[-1].append(("constant", len(constants)))
                    constants.append(int(expr))
                elif expr in position:
                    slots[-1].append(("symbol", position[expr]))
                else:
                    slots[-1].append(("complex", len(complex_)))
                    complex_.append(compile_size(expr, self.params))
        base = {"symbol": 0, "constant": len(self.params), "complex": len(self.params) + len(constants)}
        self._constants, self._complex = tuple(constants), tuple(complex_)
        self._rows = tuple(_getter([base[kind] + k for kind, k in row]) for row in slots)
        # Every value known now (no size symbols): the same rows at every call (do not modify).
        self._known = None
        if all(kind == "constant" for row in slots for kind, _ in row):
            placeholders = (0,) * len(self.params)  # no row reads a symbol's value
            self._known = [row(placeholders + self._constants) for row in self._rows]

        self._memo: dict[tuple[int, ...], list[tuple[Any, ...]]] = {}

    def __call__(self, *values: int) -> list[tuple[Any, ...]]:
        """The rows at these symbol values (the same list for the same values: do not modify it)."""
        if self._known is not None:
            return self._known
        found = self._memo.get(values)
        if found is None:
            laid_out = values
            if self._constants or self._complex:
                laid_out += self._constants + tuple([f(values) for f in self._complex])
            found = [row(laid_out) for row in self._rows]
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[values] = found
        return found


def _getter(positions: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """A function picking `positions` out of a tuple, as a tuple."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    if positions:
        k = positions[0]
        return lambda laid_out: (laid_out[k],)
    return lambda laid_out: ()


def evaluate_size(expr: Any, bindings: dict[sympy.Symbol, int]) -> int:
    """One size expression at the given symbol values."""
    params = tuple(bindings)
    return compile_size(expr, params)([bindings[p] for p in params])
