"""Signs of index expressions, for codegens that print integer `//` and `%`.

C, C++ and Triton divide integers rounding toward zero; sympy's `FloorDiv` and `Mod` (which loop
bodies index with) round toward -inf. The two agree for a non-negative dividend, the common
case: every symbol of an index is >= 0 (loop variables, sizes, in-bounds indirect indices).
But sympy moves constants out of a Mod (Mod(39 - m, 2) becomes Mod(1 - m, 2)), so a dividend
can be negative where the index itself is not; a codegen then prints floor semantics by hand.
"""

from __future__ import annotations

import sympy

from ..sizes import FloorDiv


def known_nonnegative(expr: sympy.Expr) -> bool:
    """Whether `expr` is >= 0 for every value of its symbols (each symbol being >= 0)."""
    if isinstance(expr, sympy.Symbol):
        return True
    if expr.is_Number:
        return bool(expr >= 0)
    if isinstance(expr, (sympy.Add, sympy.Mul, FloorDiv, sympy.Mod, sympy.Min)):
        return all(known_nonnegative(a) for a in expr.args)
    if isinstance(expr, sympy.Max):
        return any(known_nonnegative(a) for a in expr.args)
    if isinstance(expr, sympy.Pow):
        return known_nonnegative(expr.base)
    return False
