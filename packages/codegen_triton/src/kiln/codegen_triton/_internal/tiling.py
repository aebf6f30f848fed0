"""2-D tiles for pointwise kernels whose loads and stores are contiguous along different dims.

A transposed read (``x.t() + y``, a permute copied to a contiguous layout) walks one buffer
along dim a and another along dim b. Flattened into ``xindex``, one side is strided: each lane
of a warp touches its own 32-byte sector, about 1/8 of the bandwidth. Such a kernel instead
runs programs over YBLOCK x XBLOCK tiles of (dim a, dim b): loads along a and stores along b
are both coalesced, and Triton moves the tile between the two thread layouts through shared
memory. The other outer dims are one flat program index (``zindex``) per tile.
"""

from __future__ import annotations

import dataclasses

import sympy

from kiln.loopir import Kernel, Pointwise, index_vars

from .indexing import FlatLoop

ZINDEX = sympy.Symbol("zindex", integer=True, nonnegative=True)  # a tiled program's other dims
_MIN_TILED_SIZE = 16  # a dim shorter than this is no worse read strided than tiled


@dataclasses.dataclass(frozen=True, slots=True)
class Tile:
    """Positions in `Kernel.ranges` of the tile's row dim (y, read contiguously by some load)
    and column dim (x, along which every store is contiguous)."""

    y: int
    x: int

    def others(self, ranges: tuple[sympy.Expr, ...]) -> FlatLoop:
        """The loop over the outer dims left out of the tile, flattened into ``zindex``."""
        keep = [d for d in range(len(ranges)) if d not in (self.y, self.x)]
        variables = index_vars(len(ranges))
        return FlatLoop(ZINDEX, tuple(variables[d] for d in keep), tuple(ranges[d] for d in keep))


def _unit_dims(index: sympy.Expr, variables: tuple[sympy.Symbol, ...]) -> set[int]:
    """Dims whose variable moves `index` by exactly one element per step."""
    expanded = sympy.expand(index)
    return {d for d, v in enumerate(variables)
            if v in expanded.free_symbols and expanded.coeff(v) == 1 and v not in (expanded - v).free_symbols}


def _long_enough(size: sympy.Expr) -> bool:
    return not size.is_Integer or int(size) >= _MIN_TILED_SIZE


def pointwise_tile(kernel: Kernel) -> Tile | None:
    """The tile of a pointwise kernel whose stores are contiguous along one dim and some load
    along another, or None (a reduction, scan or row kernel, or nothing to gain)."""
    if kernel.row_ranges or not all(type(node.body) is Pointwise for node in kernel.nodes):
        return None
    variables = index_vars(len(kernel.ranges))
    accesses = [access for node in kernel.nodes for access in kernel.accesses(node).accesses]
    stores = [access for access in accesses if access.kind == "store"]
    store_dims = set.intersection(*(_unit_dims(a.index, variables) for a in stores)) if stores else set()
    load_dims = set().union(*(_unit_dims(a.index, variables) for a in accesses if a.kind != "store"))
    if len(store_dims) != 1:
        return None
    (x,) = store_dims
    candidates = sorted(d for d in load_dims - {x} if _long_enough(kernel.ranges[d]))
    if not candidates or not _long_enough(kernel.ranges[x]):
        return None
    tile = Tile(candidates[-1], x)
    tiled = {variables[tile.y], variables[tile.x]}
    # every store covers the whole tile (see `TritonHandler.store`)
    return tile if all(tiled <= sympy.sympify(a.index).free_symbols for a in stores) else None
