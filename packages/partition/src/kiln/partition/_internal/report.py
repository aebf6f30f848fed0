"""`PartitionReport`: what went into regions, what stayed outside and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch.fx as fx

from .effects import op_name


@dataclass(frozen=True, slots=True)
class RegionSummary:
    """One region: its submodule name, node names, op counts and interface (node names)."""

    name: str
    nodes: tuple[str, ...]
    op_counts: tuple[tuple[str, int], ...]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        ops = ", ".join(f"{op} x{count}" for op, count in self.op_counts)
        return f"{self.name}: {self.num_nodes} nodes ({ops})"


@dataclass(frozen=True, slots=True)
class UnsupportedNode:
    """A call node left outside every region."""

    name: str
    op: str
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {self.op} ({self.reason})"


@dataclass(frozen=True, slots=True)
class PartitionReport:
    """Attached to a partitioned GraphModule as `gm.meta["kiln_partition"]`.

    `regions` in the order they run, `unsupported` in original order, `dissolved`: regions
    with fewer than `min_size` call nodes, whose nodes stayed in the parent graph.
    """

    regions: tuple[RegionSummary, ...]
    unsupported: tuple[UnsupportedNode, ...]
    dissolved: tuple[RegionSummary, ...]
    min_size: int
    predicate: str

    @property
    def num_region_nodes(self) -> int:
        return sum(r.num_nodes for r in self.regions)

    def __str__(self) -> str:
        lines = [
            f"PartitionReport: {len(self.regions)} regions ({self.num_region_nodes} nodes), "
            f"{len(self.unsupported)} unsupported nodes, {len(self.dissolved)} dissolved "
            f"(min_size={self.min_size}); predicate {self.predicate}"
        ]
        if self.regions:
            lines += _table(
                ("region", "nodes", "in", "out", "ops"),
                [
                    (r.name, r.num_nodes, len(r.inputs), len(r.outputs), _ops(r))
                    for r in self.regions
                ],
            )
        if self.unsupported:
            lines += _table(
                ("unsupported", "op", "reason"),
                [(u.name, u.op, u.reason) for u in self.unsupported],
            )
        if self.dissolved:
            lines += _table(
                ("dissolved", "nodes", "ops"),
                [(", ".join(r.nodes), r.num_nodes, _ops(r)) for r in self.dissolved],
            )
        return "\n".join(lines)


def _ops(region: RegionSummary) -> str:
    return ", ".join(f"{op} x{count}" for op, count in region.op_counts)


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    cells = [tuple(str(c) for c in row) for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header) - 1)]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in cells
    ]


def summarize_region(
    name: str,
    nodes: Iterable[fx.Node],
    inputs: Iterable[fx.Node] = (),
    outputs: Iterable[fx.Node] = (),
) -> RegionSummary:
    """A `RegionSummary` of original nodes."""
    nodes = tuple(nodes)
    counts = Counter(op_name(n) for n in nodes)
    return RegionSummary(
        name=name,
        nodes=tuple(n.name for n in nodes),
        op_counts=tuple(sorted(counts.items())),
        inputs=tuple(n.name for n in inputs),
        outputs=tuple(n.name for n in outputs),
    )
