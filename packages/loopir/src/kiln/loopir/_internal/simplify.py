"""Index simplification with loop-variable ranges: views of views stop costing divisions.

A chain of views (reshape, transpose, reshape) composes `FloorDiv`/`Mod` unflattenings of
flat positions, e.g. reading a `[4, 128, 1024]` buffer through its `[512, 1024]` view gives
``1024*Mod(FloorDiv(i1 + 1024*i0, 1024), 128) + 131072*FloorDiv(i1 + 1024*i0, 131072) +
Mod(i1 + 1024*i0, 1024)``, which is ``i1 + 1024*i0`` because ``0 <= i1 < 1024``. Codegens
emit such expressions per element (integer divisions in the innermost loop, no
vectorization), and the scheduler compares accesses by expression, so simplifying them also
lets more nodes fuse.

Rules, for constant divisors ``d > 0`` and index variables with constant ranges
(``0 <= v < n``); symbolic ranges are left alone:

* ``FloorDiv(d*q + low, d) -> q + FloorDiv(low, d)`` when ``low >= 0``;
* ``FloorDiv(c*q + low, c*m) -> FloorDiv(q, m)`` and ``Mod(c*q + low, c*m) -> c*Mod(q, m) + low``
  when ``0 <= low < c`` (``c`` taken from the terms' coefficients; ``m = 1`` drops the op);
* ``FloorDiv(x, d) -> 0`` and ``Mod(x, d) -> x`` when ``0 <= x < d``;
  ``FloorDiv(FloorDiv(x, a), b) -> FloorDiv(x, a*b)``; ``Mod(FloorDiv(x, a), b) -> FloorDiv(x, a)``
  when ``x < a*b``;
* in sums, ``k*d*FloorDiv(x, d) + k*Mod(x, d) -> k*x``.

Bounds follow `Min`/`Max` too: a load clamped into its source's row (a padded gradient's
``30522*i0 + Min(30521, i1)``) seen through a reshape loses its divisions, and a clamp that
never binds goes (``Min(30521, r0) -> r0`` for ``r0 < 30522``: a padded bias read over the
unpadded row, which codegens then see as a contiguous read).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import sympy

from .sizes import Expr, FloorDiv

Bounds = tuple[int, int] | None  # inclusive (low, high), None: unknown


def variable_ranges(index: Sequence[Expr], ranges: Sequence[Expr]) -> dict[sympy.Symbol, int]:
    """Constant exclusive upper bounds of the variables of `index` iterating `ranges`: plain
    variables, and the digits of merged positions (``128*i0 + i1`` over 512: ``i1 < 128``,
    ``i0 < 4``)."""
    found: dict[sympy.Symbol, int] = {}
    for entry, extent in zip(index, ranges):
        if not sympy.sympify(extent).is_Integer:
            continue
        if isinstance(entry, sympy.Symbol):
            found[entry] = int(extent)
        else:
            found.update(_mixed_radix(sympy.sympify(entry), int(extent)))
    return found


def _mixed_radix(entry: Expr, extent: int) -> dict[sympy.Symbol, int]:
    """The bounds of the variables of `entry` < `extent`, a sum of digits (a variable, or the
    top digit of one cut into several, `FloorDiv(r0, 256)`: `r0 < 256 * its bound`; a lower
    digit `Mod(r0, 16)` bounds nothing) each weighted by the product of the digits' extents below."""
    digits = []
    for term in sympy.Add.make_args(entry):
        coefficient, digit = term.as_coeff_Mul()
        if not (coefficient.is_Integer and int(coefficient) > 0 and _is_digit(digit)):
            return {}
        digits.append((int(coefficient), digit))
    digits.sort(key=lambda d: d[0])
    found = {}
    for (weight, digit), (next_weight, _) in zip(digits, [*digits[1:], (extent, None)]):
        if next_weight % weight:
            return {}
        if isinstance(digit, sympy.Symbol):
            found[digit] = next_weight // weight
        elif isinstance(digit, FloorDiv):
            found[digit.args[0]] = int(digit.args[1]) * (next_weight // weight)
    return found if digits and digits[0][0] == 1 else {}


def _is_digit(expr: Expr) -> bool:
    """A variable, `FloorDiv(var, d)`, or a lower digit `Mod(var, m)` / `Mod(FloorDiv(var, d), m)`
    (constant `d`, `m`), as `ir.merged_index` cuts loop variables."""
    if isinstance(expr, sympy.Mod) and expr.args[1].is_Integer:
        expr = expr.args[0]
    if isinstance(expr, FloorDiv) and expr.args[1].is_Integer:
        expr = expr.args[0]
    return isinstance(expr, sympy.Symbol)


def simplify_index(expr: Expr, ranges: Mapping[sympy.Symbol, int]) -> Expr:
    """`expr` with the rules above applied, given ``0 <= var < ranges[var]``."""
    expr = sympy.sympify(expr)
    if expr.is_Atom or not ranges or not expr.has(FloorDiv, sympy.Mod, sympy.Min, sympy.Max):
        return expr
    return _cached(expr, tuple(sorted(ranges.items(), key=lambda item: item[0].name)))


@functools.lru_cache(maxsize=8192)
def _cached(expr: Expr, items: tuple[tuple[sympy.Symbol, int], ...]) -> Expr:
    ranges = dict(items)
    for _ in range(4):  # a rewrite can expose another (a recombined sum inside a division)
        simpler = _simplify(expr, ranges)
        if simpler == expr:
            break
        expr = simpler
    return expr


def _simplify(expr: Expr, ranges: dict[sympy.Symbol, int]) -> Expr:
    if expr.is_Atom:
        return expr
    args = [_simplify(a, ranges) for a in expr.args]
    if isinstance(expr, FloorDiv):
        return _floordiv(args[0], args[1], ranges)
    if isinstance(expr, sympy.Mod):
        return _mod(args[0], args[1], ranges)
    if isinstance(expr, (sympy.Min, sympy.Max)):
        return _min_max(type(expr), args, ranges)
    rebuilt = expr.func(*args)
    return _recombine(rebuilt, ranges) if rebuilt.is_Add else rebuilt


def _positive_int(value: Expr) -> int | None:
    return int(value) if value.is_Integer and int(value) > 0 else None


def _coefficient(term: Expr) -> int | None:
    coefficient, _ = term.as_coeff_Mul()
    return int(coefficient) if coefficient.is_Integer else None


def _split(terms: Sequence[Expr], c: int) -> tuple[list[Expr], list[Expr]] | None:
    """Terms whose coefficient `c` divides, and the others; None if a coefficient is not integer."""
    high, low = [], []
    for term in terms:
        coefficient = _coefficient(term)
        if coefficient is None:
            return None
        (high if coefficient % c == 0 else low).append(term)
    return high, low


def _candidates(terms: Sequence[Expr], d: int) -> list[int]:
    """Divisors of `d` among the terms' coefficients, largest first."""
    found = {abs(c) for c in map(_coefficient, terms) if c is not None}
    return sorted({c for c in found if c > 1 and d % c == 0}, reverse=True)


def _within(expr: Expr, ranges: dict[sympy.Symbol, int], limit: int) -> bool:
    """Whether ``0 <= expr < limit`` for every value of the variables."""
    b = _bounds(expr, ranges)
    return b is not None and b[0] >= 0 and b[1] < limit


def _nonnegative(expr: Expr, ranges: dict[sympy.Symbol, int]) -> bool:
    b = _bounds(expr, ranges)
    return b is not None and b[0] >= 0


def _floordiv(x: Expr, divisor: Expr, ranges: dict[sympy.Symbol, int]) -> Expr:
    d = _positive_int(divisor)
    if d is None:
        return FloorDiv(x, divisor)
    if isinstance(x, FloorDiv) and _positive_int(x.args[1]):
        return _floordiv(x.args[0], sympy.Integer(int(x.args[1]) * d), ranges)
    terms = sympy.Add.make_args(sympy.expand(x))
    parts = _split(terms, d)
    if parts is None:
        return FloorDiv(x, divisor)
    high, low = parts
    if high and not low:  # an exact multiple of d (40000229: recursing on the empty rest never ended)
        return sympy.expand(sympy.Add(*high) / d)
    if high and _nonnegative(sympy.Add(*low), ranges):
        return sympy.expand(sympy.Add(*high) / d) + _floordiv(sympy.Add(*low), divisor, ranges)
    for c in _candidates(terms, d):
        high, low = _split(terms, c)
        if high and _within(sympy.Add(*low), ranges, c):
            return _floordiv(sympy.expand(sympy.Add(*high) / c), sympy.Integer(d // c), ranges)
    if _within(x, ranges, d):
        return sympy.Integer(0)
    return FloorDiv(x, divisor)


def _mod(x: Expr, divisor: Expr, ranges: dict[sympy.Symbol, int]) -> Expr:
    d = _positive_int(divisor)
    if d is None:
        return sympy.Mod(x, divisor)
    if isinstance(x, FloorDiv) and _positive_int(x.args[1]) and _within(x.args[0], ranges, int(x.args[1]) * d):
        return x
    terms = sympy.Add.make_args(sympy.expand(x))
    parts = _split(terms, d)
    if parts is not None:
        x = sympy.Add(*parts[1])  # multiples of d do not change the remainder
        terms = sympy.Add.make_args(x)
        for c in _candidates(terms, d):
            high, low = _split(terms, c)
            if high and _within(sympy.Add(*low), ranges, c):
                quotient = sympy.expand(sympy.Add(*high) / c)
                return c * _mod(quotient, sympy.Integer(d // c), ranges) + sympy.Add(*low)
    if _within(x, ranges, d):
        return x
    return sympy.Mod(x, divisor)


def _min_max(func: type, args: Sequence[Expr], ranges: dict[sympy.Symbol, int]) -> Expr:
    """``Min(a, b) -> a`` where every value of `a` is at most every value of `b` (a clamp that
    never binds: ``Min(30521, r0)`` for ``r0 < 30522``), and likewise for `Max`."""
    bounds = [_bounds(a, ranges) for a in args]
    for k, b in enumerate(bounds):
        if b is None:
            continue
        others = [o for j, o in enumerate(bounds) if j != k]
        if func is sympy.Min and all(o is not None and b[1] <= o[0] for o in others):
            return args[k]
        if func is sympy.Max and all(o is not None and b[0] >= o[1] for o in others):
            return args[k]
    return func(*args)


def _recombine(total: Expr, ranges: dict[sympy.Symbol, int]) -> Expr:
    """``k*d*FloorDiv(x, d) + k*Mod(x, d) -> k*x`` in a sum, as often as it applies."""
    terms = list(sympy.Add.make_args(total))
    changed = True
    while changed:
        changed = False
        for term in terms:
            k, rest = term.as_coeff_Mul()
            if not (isinstance(rest, sympy.Mod) and _positive_int(rest.args[1])):
                continue
            inner, d = rest.args
            partner = k * d * _floordiv(inner, d, ranges)
            if partner in terms:
                terms.remove(term)
                terms.remove(partner)
                terms.append(sympy.expand(k * inner))
                changed = True
                break
    return sympy.Add(*terms)


def _bounds(expr: Any, ranges: dict[sympy.Symbol, int]) -> Bounds:
    if expr.is_Integer:
        return int(expr), int(expr)
    if isinstance(expr, sympy.Symbol):
        return (0, ranges[expr] - 1) if expr in ranges else None
    if expr.is_Add:
        parts = [_bounds(a, ranges) for a in expr.args]
        if any(p is None for p in parts):
            return None
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if expr.is_Mul:
        coefficient, rest = expr.as_coeff_Mul()
        if not coefficient.is_Integer:
            return None
        low, high = 1, 1
        for factor in sympy.Mul.make_args(rest):
            b = _bounds(factor, ranges)
            if b is None or b[0] < 0:
                return None
            low, high = low * b[0], high * b[1]
        c = int(coefficient)
        return (c * low, c * high) if c >= 0 else (c * high, c * low)
    if isinstance(expr, FloorDiv) and _positive_int(expr.args[1]):
        b = _bounds(expr.args[0], ranges)
        d = int(expr.args[1])
        return (b[0] // d, b[1] // d) if b is not None and b[0] >= 0 else None
    if isinstance(expr, sympy.Mod) and _positive_int(expr.args[1]):
        d = int(expr.args[1])
        b = _bounds(expr.args[0], ranges)
        if b is not None and b[0] >= 0 and b[1] < d:
            return b
        return 0, d - 1
    if isinstance(expr, (sympy.Min, sympy.Max)):  # a load clamped into its source (cat, pad, slice_scatter)
        parts = [_bounds(a, ranges) for a in expr.args]
        if any(p is None for p in parts):
            return None
        pick = min if isinstance(expr, sympy.Min) else max
        return pick(p[0] for p in parts), pick(p[1] for p in parts)
    return None
