"""Index arithmetic of generated kernels: offsets in flat positions, and the index width.

A kernel flattens its outer ranges into one program axis, ``xindex``, and each loop over
reduction (or row) ranges into ``rindex``; the loop variables ``i0, i1, ...`` / ``r0, r1, ...``
are recovered from them with `//` and `%` (`FlatLoop.unflattening`). Integer division is
emulated on GPUs (slowly, and more slowly in 64 bits), yet most accesses need none: a
contiguous ``256*i0 + i1`` over ranges ``[n, 256]`` is ``xindex``. `flat_offset` rewrites an
index expression in the flat positions when that takes fewer divisions and remainders:

* runs of consecutive dimensions whose coefficients walk them contiguously merge
  (``c*s1*i0 + c*i1 -> c*xindex``; a run inside the ranges becomes ``c*((xindex // q) % m)``),
  exact for symbolic sizes too;
* with constant ranges, the remaining loop variables are replaced by their unflattening and
  loopir's range-aware `simplify_index` (``0 <= xindex < xnumel``) simplifies the result.

`index_bounds` bounds every value an index expression computes, so that a kernel whose values
all fit uses 32-bit index arithmetic; with symbolic sizes the launcher decides, for each call's
sizes (`index_width`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterable, Mapping, Sequence

import sympy

# simplify_index: loopir applies it to loop bodies itself; used here on index expressions
# rewritten in flat positions, which loopir never sees.
from kiln.loopir import FloorDiv, index_vars, simplify_index

log = logging.getLogger(__name__)

# A valid lane's index values must stay below this for 32-bit indices: the last block's masked
# lanes (a Triton block holds at most 2**20 elements) run past xnumel and rnumel, and their
# xindex / rindex must not wrap around to pass the mask.
INT32_LIMIT = 2**31 - 2**20

XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)  # a program's outer points
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)  # a reduction or row loop's chunk


def _product(sizes: Iterable[sympy.Expr]) -> sympy.Expr:
    return sympy.Mul(*sizes)


@dataclasses.dataclass(frozen=True, slots=True)
class FlatLoop:
    """A loop over the flattened `sizes`: ``flat`` (xindex or rindex) walks ``0 .. numel-1``
    and `variables` are the row-major unflattening of it."""

    flat: sympy.Symbol
    variables: tuple[sympy.Symbol, ...]
    sizes: tuple[sympy.Expr, ...]

    @property
    def numel(self) -> sympy.Expr:
        return _product(self.sizes)

    def varying(self) -> list[int]:
        """Positions of the dimensions of a size other than 1 (loop bodies pin the others to 0)."""
        return [dim for dim, size in enumerate(self.sizes) if size != 1]

    def piece(self, first: int, last: int) -> sympy.Expr:
        """``sum(stride_k * v_k for k in first..last) / stride_last`` for row-major strides: the
        flat position of dimensions `first` to `last` together, as a function of `flat`."""
        value = self.flat
        inner = _product(self.sizes[last + 1:])
        if inner != 1:
            value = FloorDiv(value, inner)
        if first != self.varying()[0]:  # the outermost dimension needs no remainder: flat < numel
            value = sympy.Mod(value, _product(self.sizes[first:last + 1]), evaluate=False)
        return value

    def unflattening(self) -> dict[sympy.Symbol, sympy.Expr]:
        """Each varying variable as a function of `flat`."""
        return {self.variables[dim]: self.piece(dim, dim) for dim in self.varying()}


def outer_loop(ranges: Sequence[sympy.Expr]) -> FlatLoop:
    """The program axis: ``xindex`` over a kernel's outer `ranges` (variables i0, i1, ...)."""
    return FlatLoop(XINDEX, index_vars(len(ranges)), tuple(ranges))


def inner_loop(ranges: Sequence[sympy.Expr]) -> FlatLoop:
    """A reduction or row loop: ``rindex`` over `ranges` (variables r0, r1, ...)."""
    return FlatLoop(RINDEX, index_vars(len(ranges), "r"), tuple(ranges))


def divisions(expr: sympy.Expr) -> int:
    """How many `//` and `%` evaluating `expr` takes."""
    return sum(isinstance(sub, (FloorDiv, sympy.Mod)) for sub in sympy.preorder_traversal(expr))


def _cost(expr: sympy.Expr, loops: Sequence[FlatLoop]) -> int:
    """Divisions of `expr`, counting those that define the loop variables it uses."""
    definitions = {var: value for loop in loops for var, value in loop.unflattening().items()}
    return divisions(expr) + sum(divisions(definitions[s]) for s in expr.free_symbols if s in definitions)


@functools.lru_cache(maxsize=4096)
def flat_offset(expr: sympy.Expr, loops: tuple[FlatLoop, ...]) -> sympy.Expr:
    """`expr` (in the loops' variables) rewritten with the loops' flat positions where that
    needs fewer divisions (see the module docstring); `expr` itself when nothing is cheaper.
    Equal to `expr` wherever every flat position is inside its loop."""
    expr = sympy.sympify(expr)
    if not any(var in expr.free_symbols for loop in loops for var in loop.variables):
        return expr
    candidates = [expr]
    merged = expr
    for loop in loops:
        merged = _merge_runs(merged, loop)
    candidates.append(merged)
    if all(loop.numel.is_Integer for loop in loops):
        substituted = merged.xreplace({v: e for loop in loops for v, e in loop.unflattening().items()})
        simplified = simplify_index(substituted, {loop.flat: int(loop.numel) for loop in loops})
        if all(number.is_Integer for number in simplified.atoms(sympy.Number)):
            candidates.append(simplified)
    return min(candidates, key=lambda candidate: _cost(candidate, loops))  # the first of the cheapest


def _merge_runs(expr: sympy.Expr, loop: FlatLoop) -> sympy.Expr:
    """`expr` with every sum's contiguous runs of `loop`'s variables merged, innermost sums first."""
    if expr.is_Atom:
        return expr
    args = [_merge_runs(arg, loop) for arg in expr.args]
    if args != list(expr.args):
        expr = expr.func(*args)
    return _merge_sum(expr, loop) if expr.is_Add else expr


def _merge_sum(total: sympy.Expr, loop: FlatLoop) -> sympy.Expr:
    """``c*size_b*v_a + c*v_b + rest -> c*piece(a, b) + rest`` for runs of two or more
    consecutive varying dimensions a..b, each coefficient the next one times the next size."""
    coefficients: dict[sympy.Symbol, sympy.Expr] = {}
    others = []
    for term in sympy.Add.make_args(total):
        coefficient, var = term.as_independent(*loop.variables, as_Add=False)
        if var in loop.variables and var not in coefficients:
            coefficients[var] = coefficient
        else:
            others.append(term)
    runs: list[list[int]] = []
    for dim in loop.varying():
        var = loop.variables[dim]
        if var not in coefficients:
            continue
        if runs and runs[-1][-1] == _previous(loop, dim) and _contiguous(loop, runs[-1][-1], dim, coefficients):
            runs[-1].append(dim)
        else:
            runs.append([dim])
    if all(len(run) == 1 for run in runs):
        return total
    terms = others
    for run in runs:
        inner = loop.variables[run[-1]]
        if len(run) == 1:
            terms.append(coefficients[inner] * inner)
        else:
            terms.append(coefficients[inner] * loop.piece(run[0], run[-1]))
    return sympy.Add(*terms)


def _previous(loop: FlatLoop, dim: int) -> int | None:
    varying = loop.varying()
    position = varying.index(dim)
    return varying[position - 1] if position else None


def _contiguous(loop: FlatLoop, outer: int, inner: int, coefficients: Mapping[sympy.Symbol, sympy.Expr]) -> bool:
    step = coefficients[loop.variables[inner]] * loop.sizes[inner]
    return sympy.expand(coefficients[loop.variables[outer]] - step) == 0


def index_bounds(expr: sympy.Expr, maxima: Mapping[sympy.Symbol, sympy.Expr]) -> set[sympy.Expr]:
    """Expressions whose maximum bounds the magnitude of every value evaluating `expr` computes
    (its partial sums and products included), given ``0 <= s <= maxima[s]``. Symbols not in
    `maxima` are sizes (non-negative, bounded by themselves). A variable with maximum 0 stands
    for an indirect index: values computed from it are 64-bit whatever the index width, so
    they count as 0 and only their 32-bit parts are bounded."""
    found: set[sympy.Expr] = set()
    _bound(sympy.sympify(expr), maxima, found)
    return found


def _bound(expr: sympy.Expr, maxima: Mapping[sympy.Symbol, sympy.Expr], found: set[sympy.Expr]) -> sympy.Expr:
    """A bound on ``|expr|``; adds it, and bounds of the intermediate values, to `found`."""
    if expr.is_Integer:
        value = abs(expr)
    elif expr.is_Symbol:
        value = maxima.get(expr, expr)
    else:
        values = [_bound(arg, maxima, found) for arg in expr.args]
        if expr.is_Add:
            value = sympy.Add(*values)
        elif expr.is_Mul:
            value = sympy.Mul(*values)
            found.add(sympy.Mul(*(_extreme(sympy.Max, [v, sympy.Integer(1)]) for v in values)))  # partial products
        elif isinstance(expr, FloorDiv):  # by a positive size: |a // d| <= |a| // d + 1
            divisor = expr.args[1]
            value = values[0] if divisor.free_symbols & set(maxima) else FloorDiv(values[0], divisor) + 1
        elif isinstance(expr, sympy.Mod):
            value = _extreme(sympy.Min, values)
        elif isinstance(expr, (sympy.Max, sympy.Min)):
            value = _extreme(sympy.Max, values)
        elif expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 0:
            value = values[0] ** int(expr.exp)
        else:
            raise NotImplementedError(f"cannot bound index expression {expr}")
    found.add(value)
    return value


def _extreme(function: type[sympy.Max] | type[sympy.Min], args: Sequence[sympy.Expr]) -> sympy.Expr:
    """`function(*args)`, evaluated only for numbers: sympy's comparisons of symbolic
    arguments are slow, and the launcher evaluates these with the sizes anyway."""
    args = list(dict.fromkeys(args))
    if len(args) == 1:
        return args[0]
    return function(*args, evaluate=all(a.is_Number for a in args))


@dataclasses.dataclass(frozen=True, slots=True)
class IndexWidth:
    """The width of a kernel's index arithmetic: `bits` 32 or 64, or None when the launcher
    picks it for each call's sizes (an ``INDEX_64`` constexpr) by evaluating `bounds`,
    expressions in the kernel's size symbols (64 bits when one reaches `INT32_LIMIT`)."""

    bits: int | None
    bounds: tuple[sympy.Expr, ...] = ()


def index_width(bounds: Iterable[sympy.Expr], symbols: Iterable[sympy.Symbol]) -> IndexWidth:
    """32 bits when every bound is a constant below `INT32_LIMIT`; chosen at launch when the
    others are expressions in `symbols` (the kernel's size arguments); else 64 bits."""
    bounds = set(map(sympy.sympify, bounds))
    largest = max((int(b) for b in bounds if b.is_Integer), default=0)
    symbolic = sorted((b for b in bounds if not b.is_Integer), key=str)
    if largest >= INT32_LIMIT or any(not b.free_symbols <= set(symbols) for b in symbolic):
        return IndexWidth(64)
    return IndexWidth(None, tuple(symbolic)) if symbolic else IndexWidth(32)
