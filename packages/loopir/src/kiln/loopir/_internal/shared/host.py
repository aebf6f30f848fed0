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

_FOLDS = {sympy.Add: operator.add, sympy.Mul: operator.mul, sympy.Max: max, sympy.Min: min}


def compile_size(expr: Any, params: Sequence[sympy.Symbol]) -> Compiled:
    """`expr` as a function of the values of `params` (in order). Raises NotImplementedError
    naming the expression when it uses anything but integers, `params`, +, *, `FloorDiv`,
    `Mod`, Max, Min and positive integer powers."""
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
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        base, exponent = args[0], int(expr.exp)
        return lambda values: base(values) ** exponent
    raise NotImplementedError(f"cannot evaluate size expression {whole} on the host: {expr} is not an "
                              "integer operation loopir uses")


class SizeFunction:
    """Symbol values -> one tuple of ints per row of size expressions.

    ``SizeFunction(kernel.symbols, [o.size for o in kernel.outputs])(*values)`` gives each
    output's shape. With ``unknown_as_none=True`` an expression that uses a symbol outside
    `params` evaluates to None (a size the caller does not constrain) instead of raising.
    """

    __slots__ = ("_rows", "params")

    def __init__(self, params: Sequence[sympy.Symbol], rows: Sequence[Sequence[Any]],
                 unknown_as_none: bool = False) -> None:
        self.params = tuple(params)
        known = set(self.params)

        def item(expr: Any) -> Compiled:
            if unknown_as_none and not sympy.sympify(expr).free_symbols <= known:
                return lambda values: None
            return compile_size(expr, self.params)

        self._rows = tuple(tuple(item(e) for e in row) for row in rows)

    def __call__(self, *values: int) -> list[tuple[Any, ...]]:
        return [tuple(item(values) for item in row) for row in self._rows]


def evaluate_size(expr: Any, bindings: dict[sympy.Symbol, int]) -> int:
    """One size expression at the given symbol values."""
    params = tuple(bindings)
    return compile_size(expr, params)([bindings[p] for p in params])
