"""Row loops cut to fit a consumer: a group norm's normalization in its statistics' kernel.

A group norm reduces rows of `(N, G)` over `C/G * H * W` elements, and its normalization runs
over `(N, C, H, W)` with a per-channel weight: the same elements in the same order, regrouped
(`ir.merged_index` with `split`). Placed in the reduction's loops as they are, the channel is
``8*i1 + r0//256``: a division of the row variable, which a vector loop over `r0` cannot load
(codegen_cpp would vectorize across outputs with strided loads). So the kernel's row loop is
cut where the consumer's accesses divide it: `[2048]` becomes `[8, 256]`, the channel is
``8*i1 + r0`` and every access moves with `r1` contiguously. The kernel's reductions are
rebuilt over the cut loops (their values and order of elements are unchanged); a codegen that
flattens row loops (codegen_triton) emits the same code either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sympy

from .body import LoopBody
from .ir import ComputedBuffer, Pointwise, Reduction, Scan, merged_index
from .sizes import Expr, FloorDiv, index_vars, same_exprs

# A consumer whose accesses still divide a row variable after this many cuts is not fused.
_MAX_CUTS = 8


def cut_row_ranges(node: ComputedBuffer, ranges: Sequence[Expr], row_ranges: Sequence[Expr]
                   ) -> tuple[Expr, ...] | None:
    """The row ranges (`row_ranges`, cut where needed) in which pointwise `node` runs as a row
    node with no division of a row variable left in its loads, stores and index values;
    `tuple(row_ranges)` when none is needed; None when `node` is not a regrouping of
    `ranges` x `row_ranges` or its accesses divide row variables in ways cuts cannot undo."""
    if not isinstance(node.body, Pointwise) or not row_ranges:
        return None
    rows = tuple(row_ranges)
    for _ in range(_MAX_CUTS):
        variables = (*index_vars(len(ranges)), *index_vars(len(rows), "r"))
        index = merged_index(node.ranges, (*ranges, *rows), variables, split=True)
        if index is None:
            return None
        cuts = _divided_row_variables(node.accesses_at(index, ()), variables[len(ranges):])
        if cuts is None:
            return None
        if not cuts:
            return rows
        cut = _cut(rows, cuts)
        if cut == rows:
            return None
        rows = cut
    return None


def _divided_row_variables(accesses, row_vars: Sequence[sympy.Symbol]) -> dict[int, set[int]] | None:
    """Per row variable (by position), the extents below the points where the accesses divide
    it (`r0//256`, `Mod(r0, 16)`, `Mod(r0//16, 16)`: 256; 16; 16 and 256); None when a row
    variable is divided inside anything else (a sum, a symbolic divisor)."""
    position = {var: k for k, var in enumerate(row_vars)}
    cuts: dict[int, set[int]] = {}
    for expr in [a.index for a in accesses.accesses] + list(accesses.index_exprs):
        for sub in sympy.preorder_traversal(sympy.sympify(expr)):
            if not isinstance(sub, (FloorDiv, sympy.Mod)) or not sub.free_symbols & position.keys():
                continue
            inner, divisor = sub.args
            if not divisor.is_Integer:
                return None
            below = 1
            if isinstance(inner, FloorDiv) and isinstance(sub, sympy.Mod) and inner.args[1].is_Integer:
                inner, below = inner.args[0], int(inner.args[1])
            if inner not in position:
                return None
            points = {below, below * int(divisor)} if isinstance(sub, sympy.Mod) else {int(divisor)}
            cuts.setdefault(position[inner], set()).update(points)
    return cuts


def _cut(rows: tuple[Expr, ...], cuts: dict[int, set[int]]) -> tuple[Expr, ...]:
    """`rows` with dim k cut into digits at the extents `cuts[k]` that divide it."""
    result: list[Expr] = []
    for k, extent in enumerate(rows):
        size = int(extent)
        points = sorted(p for p in cuts.get(k, ()) if 1 < p < size and size % p == 0)
        points = [p for p in points if all(p % q == 0 for q in points if q < p)]  # nested digits only
        upper = size
        for point in reversed(points):
            result.append(sympy.Integer(upper // point))
            upper = point
        result.append(sympy.Integer(upper))
    return tuple(result)


def recut_reduction(node: ComputedBuffer, rows: Sequence[Expr]) -> ComputedBuffer | None:
    """Reduction `node` over the cut row loops `rows` (each of its reduction dims the product
    of consecutive ones: the same elements reduced in the same order), or None when they are
    not a cut of its reduction ranges."""
    if not isinstance(node.body, Reduction) or isinstance(node.body, Scan):
        return None
    if same_exprs(node.reduction_ranges, rows):
        return node
    rindex = merged_index(node.reduction_ranges, rows, index_vars(len(rows), "r"))
    if rindex is None:
        return None
    body = dataclasses.replace(node.body, reduction_ranges=tuple(rows),
                               inner_fn=_MergedRows(node.body.loop_body, rindex))
    return ComputedBuffer(node.spec, body, node.origins)


@dataclasses.dataclass(frozen=True, slots=True)
class _MergedRows:
    """An inner_fn replaying `body` with each of its reduction variables the merged position
    `rindex` of the cut ones."""

    body: LoopBody
    rindex: tuple[Expr, ...]

    def __call__(self, ops, index, rindex):
        mapping = dict(zip(index_vars(len(rindex), "r"), rindex))
        return self.body.replay(ops, index, tuple(sympy.sympify(e).xreplace(mapping) for e in self.rindex))
