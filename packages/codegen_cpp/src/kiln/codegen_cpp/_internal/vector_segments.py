"""A vector loop split into segments where its indices are clamped: each segment's indices are
affine in the loop variable, so its loads stay contiguous vector loads.

Concatenation, padding and slicing lower to clamped indices: the rotary embedding's
`cat((-x2, x1), -1)` over a head of 64 reads `x[..., Min(31, i) + 32]` and
`x[..., Min(31, Max(0, i - 32))]` and picks one of them with `where(i < 32, ...)`. Along `i`
neither index is contiguous, so the whole kernel went to a short outer loop (the heads, 4 lanes
of 16) with lane-by-lane loads: 4x slower than Inductor. Over `i` in [0, 32) the first index is
`i + 32` and the second the constant 0; over [32, 64) they are 63 and `i - 32`. So the vector
loop runs as one loop per segment, each with every Min/Max resolved.

`resolve_clamps` resolves what one segment decides and names the points where an undecided
Min/Max changes branch; the caller splits there and tries again (`MAX_SEGMENTS` at most).
"""

from __future__ import annotations

import math
import operator

import sympy

MAX_SEGMENTS = 8
# Comparisons decided over a whole segment when both ends agree (affine, hence monotonic).
_ORDERED = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}


def _affine_difference(a: sympy.Expr, b: sympy.Expr, var: sympy.Symbol) -> tuple[sympy.Rational, sympy.Rational] | None:
    """(slope, offset) of `a - b` as a function of `var` alone, or None when it is not one."""
    difference = sympy.expand(a - b)
    if not difference.free_symbols <= {var}:
        return None
    slope = difference.coeff(var)
    offset = sympy.expand(difference - slope * var)
    if not (slope.is_Rational and offset.is_Rational):
        return None
    return slope, offset


def _decided(clamp: sympy.Expr, var: sympy.Symbol, lo: int, hi: int, points: set[int]) -> sympy.Expr | None:
    """The argument of a Min (Max) that is the least (greatest) for every `var` in [lo, hi), if
    one is; else None, with the points where two arguments cross added to `points`."""
    sign = 1 if isinstance(clamp, sympy.Min) else -1
    crossings: set[int] = set()  # added to `points` only when no argument wins throughout
    for candidate in clamp.args:
        always = True
        for other in clamp.args:
            if other is candidate:
                continue
            affine = _affine_difference(candidate, other, var)
            if affine is None:
                always = False
                continue
            slope, offset = affine
            if max(sign * (slope * lo + offset), sign * (slope * (hi - 1) + offset)) > 0:
                always = False
                if slope != 0:  # they cross where slope * var + offset = 0 (equal there, if anywhere)
                    point = math.ceil(-offset / slope)
                    if lo < point < hi:
                        crossings.add(point)
        if always:
            return candidate
    points |= crossings
    return None


def resolve_clamps(expr: sympy.Expr, var: sympy.Symbol, lo: int, hi: int) -> tuple[sympy.Expr, set[int]]:
    """`expr` with every Min/Max that depends on `var` replaced by its argument that wins for all
    `var` in [lo, hi) (inner ones first), and the points in (lo, hi) where one left undecided
    changes branch."""
    points: set[int] = set()

    def visit(node: sympy.Expr) -> sympy.Expr:
        if node.is_Atom or not node.has(var):
            return node
        node = node.func(*(visit(arg) for arg in node.args))
        if isinstance(node, (sympy.Min, sympy.Max)):
            decided = _decided(node, var, lo, hi, points)
            if decided is not None:
                return decided
        return node

    return visit(sympy.sympify(expr)), points


def decide_comparison(op: str, a: sympy.Expr, b: sympy.Expr, var: sympy.Symbol, lo: int, hi: int
                      ) -> tuple[bool | None, set[int]]:
    """The value of `a <op> b` for every `var` in [lo, hi), where it is one (else None), and the
    point in (lo, hi) where it changes (the concatenation's `where(i < 32, ...)` is true on one
    segment, false on the other)."""
    compare = _ORDERED.get(op)
    affine = _affine_difference(a, b, var) if compare is not None else None
    if affine is None:
        return None, set()
    slope, offset = affine

    def holds(at: int) -> bool:
        return bool(compare(slope * at + offset, 0))

    if holds(lo) == holds(hi - 1):  # affine, hence monotonic: the same throughout
        return holds(lo), set()
    near = math.ceil(-offset / slope)
    return None, {p for p in (near - 1, near, near + 1) if lo < p < hi and holds(p) != holds(p - 1)}


def split_segments(segments: list[tuple[int, int]], points: set[int]) -> list[tuple[int, int]]:
    """`segments` (consecutive [lo, hi) ranges) cut at `points`."""
    cuts = sorted(points)
    result = []
    for lo, hi in segments:
        inside = [p for p in cuts if lo < p < hi]
        bounds = [lo, *inside, hi]
        result += list(zip(bounds, bounds[1:]))
    return result


def segment_loops(var: sympy.Symbol, segments: list[tuple[int, int, list[str]]]) -> list[str]:
    """One vector loop (whole vectors, then a partial one) per segment [lo, hi) of `var`, each
    running its own statements."""
    lines = []
    for lo, hi, body in segments:
        length = hi - lo
        end = f"{lo} + kiln::vector_end({length})"
        lines += [f"for (int64_t {var} = {lo}; {var} < {end}; {var} += KILN_LANES) {{  // vector code, "
                  f"{var} in [{lo}, {hi})",
                  "    constexpr int64_t active = KILN_LANES;", *["    " + line for line in body], "}",
                  f"if (kiln::vector_end({length}) < {length}) {{  // the tail: one partial vector",
                  f"    const int64_t {var} = {end}, active = {hi} - {var};", *["    " + line for line in body], "}"]
    return lines
