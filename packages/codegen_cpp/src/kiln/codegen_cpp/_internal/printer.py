"""Sympy index and size expressions printed as C++ (host sizes: `kiln.loopir.codegen.SizeFunction`)."""

from __future__ import annotations

import sympy

from kiln.loopir import FloorDiv
from kiln.loopir.codegen import known_nonnegative


def _fold(args: list[str], op: str) -> str:
    return "(" + f" {op} ".join(args) + ")"


def cpp_expr(expr: sympy.Expr) -> str:
    """An integer index expression as C++ (int64_t arithmetic), with sympy's floor semantics
    for `//` and `%`: C++'s own where the dividend is known to be >= 0, else corrected."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return f"{int(expr)}L" if abs(int(expr)) > 2**31 - 1 else str(int(expr))
    if isinstance(expr, sympy.Symbol):
        return expr.name
    args = [cpp_expr(a) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return _fold(args, "+")
    if isinstance(expr, sympy.Mul):
        return _fold(args, "*")
    if isinstance(expr, (FloorDiv, sympy.Mod)) and not known_nonnegative(expr.args[0]):
        # C++ rounds toward zero, sympy toward -inf (the divisor is a positive size): the
        # remainder takes the divisor's sign, and the quotient divides exactly
        mod = f"((({args[0]} % {args[1]}) + {args[1]}) % {args[1]})"
        return mod if isinstance(expr, sympy.Mod) else f"(({args[0]} - {mod}) / {args[1]})"
    if isinstance(expr, FloorDiv):
        return f"({args[0]} / {args[1]})"
    if isinstance(expr, sympy.Mod):
        return f"({args[0]} % {args[1]})"
    if isinstance(expr, sympy.Max):
        return _nested("std::max<int64_t>", args)
    if isinstance(expr, sympy.Min):
        return _nested("std::min<int64_t>", args)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and int(expr.exp) > 0:
        return _fold([args[0]] * int(expr.exp), "*")
    raise NotImplementedError(f"cannot print index expression {expr} as C++")


def _nested(fn: str, args: list[str]) -> str:
    out = args[0]
    for a in args[1:]:
        out = f"{fn}({out}, {a})"
    return out
