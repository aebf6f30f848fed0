"""`PartitionReport`: what went into regions, what stayed outside and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from .effects import cached_op_name


@dataclass(frozen=True, slots=True)
class RegionSummary:
    """One region: its submodule name, node names, op counts and interface (node names)."""

    name: str
    nodes: tuple[str, ...]
    op_counts: tuple[tuple[str, int], ...]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    node_ops: tuple[str, ...] = ()  # op_name of each node, same order as `nodes`

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
class RegionSplit:
    """Why `region` is not part of `after`: "unsupported node", "cycle avoidance" or "min_size".

    `after` is the earlier region (or dissolved group) it could not join, None when the
    split goes back to the graph inputs; `detail` names the unsupported node (and, for
    cycle avoidance, the direct read that could not be kept inside one region).
    """

    region: str
    after: str | None
    reason: str
    detail: str

    def __str__(self) -> str:
        after = f" after {self.after}" if self.after else ""
        return f"{self.region}{after}: {self.reason} ({self.detail})"


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
    splits: tuple[RegionSplit, ...] = ()

    @property
    def num_region_nodes(self) -> int:
        return sum(r.num_nodes for r in self.regions)

    @property
    def outside(self) -> tuple[UnsupportedNode, ...]:
        """Every call node left outside the regions, with why: the unsupported nodes, then the
        nodes of dissolved regions (reason "min_size")."""
        small = tuple(
            UnsupportedNode(name, op, f"min_size: its region has {r.num_nodes} < {self.min_size} nodes")
            for r in self.dissolved
            for name, op in zip(r.nodes, r.node_ops)
        )
        return self.unsupported + small

    def split_counts(self) -> dict[str, int]:
        """How many splits each reason caused."""
        return dict(sorted(Counter(s.reason for s in self.splits).items()))

    def __str__(self) -> str:
        lines = [
            f"PartitionReport: {len(self.regions)} regions ({self.num_region_nodes} nodes), "
            f"{len(self.unsupported)} unsupported nodes, {len(self.dissolved)} dissolved "
            f"(min_size={self.min_size}); predicate {self.predicate}"
        ]
        if self.splits:
            counts = ", ".join(f"{reason} x{n}" for reason, n in self.split_counts().items())
            lines.append(f"  regions split by: {counts}")
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
        if self.splits:
            lines += _table(
                ("split", "after", "reason", "detail"),
                [(s.region, s.after or "-", s.reason, s.detail) for s in self.splits],
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
    names: dict[Any, str] | None = None,
) -> RegionSummary:
    """A `RegionSummary` of original nodes (`names`: an op-name cache shared across calls)."""
    nodes = tuple(nodes)
    cache = {} if names is None else names
    ops = tuple(cached_op_name(n, cache) for n in nodes)
    return RegionSummary(
        name=name,
        nodes=tuple(n.name for n in nodes),
        op_counts=tuple(sorted(Counter(ops).items())),
        inputs=tuple(n.name for n in inputs),
        outputs=tuple(n.name for n in outputs),
        node_ops=ops,
    )
