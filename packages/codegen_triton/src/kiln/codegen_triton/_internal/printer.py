"""Sympy index expressions printed as Triton source (host sizes: `kiln.loopir.codegen.SizeFunction`).

Built on sympy's `StrPrinter` (so ``5*i0 + r0`` reads as sympy prints it), with the integer
operations loopir uses: `FloorDiv` -> ``//``, `Mod` -> ``%``, `Max`/`Min`, positive integer
powers as products. Anything else (rationals, floats, other functions) is refused.
"""

from __future__ import annotations

import logging

import sympy
from sympy.printing.precedence import PRECEDENCE
from sympy.printing.str import StrPrinter

from kiln.loopir import FloorDiv
from kiln.loopir.codegen import known_nonnegative

log = logging.getLogger(__name__)


class _IndexPrinter(StrPrinter):
    def __init__(self, device: bool) -> None:
        super().__init__()
        self.device = device

    def _print_integer_op(self, expr: sympy.Expr, op: str) -> str:
        # `a*b // c` needs no parentheses (left to right), `a // (b*c)` does.
        base = self.parenthesize(expr.args[0], PRECEDENCE["Mul"], strict=True)
        divisor = self.parenthesize(expr.args[1], PRECEDENCE["Mul"])
        return f"({base} {op} {divisor})"

    def _print_FloorDiv(self, expr: sympy.Expr) -> str:
        if self._may_truncate(expr):  # (a - a mod b) / b divides exactly: no rounding to differ
            return f"(({self._print(expr.args[0])} - {self._print_Mod(sympy.Mod(*expr.args, evaluate=False))}) // " \
                   f"{self.parenthesize(expr.args[1], PRECEDENCE['Mul'])})"
        return self._print_integer_op(expr, "//")

    def _print_Mod(self, expr: sympy.Expr) -> str:
        if self._may_truncate(expr):  # Triton's % keeps the dividend's sign, sympy's Mod the divisor's
            divisor = self.parenthesize(expr.args[1], PRECEDENCE["Mul"])
            return f"(({self._print_integer_op(expr, '%')} + {divisor}) % {divisor})"
        return self._print_integer_op(expr, "%")

    def _may_truncate(self, expr: sympy.Expr) -> bool:
        """Whether Triton's integer `//` and `%` (C's: rounding toward zero) can differ from
        sympy's floor semantics here: on the device, for a dividend not known to be >= 0 (sympy
        moves constants out of a Mod: Mod(39 - m, 2) becomes Mod(1 - m, 2), negative for m > 1).
        Every symbol is >= 0 (loop variables, sizes, in-bounds indirect indices)."""
        return self.device and not known_nonnegative(expr.args[0])

    def _print_minmax(self, expr: sympy.Expr, device_name: str, host_name: str) -> str:
        name = device_name if self.device else host_name
        args = [self._print(a) for a in expr.args]
        out = args[0]
        for arg in args[1:]:
            out = f"{name}({out}, {arg})"
        return out

    def _print_Max(self, expr: sympy.Expr) -> str:
        return self._print_minmax(expr, "tl.maximum", "max")

    def _print_Min(self, expr: sympy.Expr) -> str:
        return self._print_minmax(expr, "tl.minimum", "min")

    def _print_Pow(self, expr: sympy.Expr, rational: bool = False) -> str:
        if expr.exp.is_Integer and int(expr.exp) > 0:
            return "(" + " * ".join([f"({self._print(expr.base)})"] * int(expr.exp)) + ")"
        return self._refuse(expr)

    def _print_Rational(self, expr: sympy.Expr) -> str:
        return self._refuse(expr)

    def _print_Float(self, expr: sympy.Expr) -> str:
        return self._refuse(expr)

    def _print_Function(self, expr: sympy.Expr) -> str:
        return self._refuse(expr)

    def _refuse(self, expr: sympy.Expr) -> str:
        where = "Triton" if self.device else "Python"
        raise NotImplementedError(f"cannot print integer expression {expr} as {where} source")


def _check_kinds(expr: sympy.Expr) -> None:
    for sub in sympy.preorder_traversal(expr):
        if isinstance(sub, sympy.Function) and not isinstance(sub, (FloorDiv, sympy.Mod)):
            if not isinstance(sub, (sympy.Max, sympy.Min)):
                raise NotImplementedError(f"cannot print integer expression {expr}: unknown function {sub.func}")


def triton_expr(expr: sympy.Expr) -> str:
    """An integer index expression as Triton source (`//` and `%` with sympy's floor semantics:
    as Triton's own where the dividend is known to be >= 0, else corrected)."""
    expr = sympy.sympify(expr)
    _check_kinds(expr)
    return _IndexPrinter(device=True).doprint(expr)
