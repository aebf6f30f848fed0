"""What kiln did with each graph: kernels generated, nodes lowered, nodes left to eager and why."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class FallbackNode:
    """An ATen node that runs as an eager kernel instead of generated code."""

    node: str
    op: str
    reason: str

    def __str__(self) -> str:
        return f"{self.op} ({self.node}): {self.reason}"


@dataclasses.dataclass(frozen=True, slots=True)
class GraphReport:
    """One Dynamo graph through the pipeline."""

    index: int
    compiled: bool  # False: the whole graph ran eagerly (see `reason`)
    reason: str | None
    lowered_nodes: tuple[str, ...]  # op of every ATen node lowered into kernels or externs
    fallback_nodes: tuple[FallbackNode, ...]
    kernels: int
    externs: int
    source: str  # generated code of every kernel of this graph
    stage_seconds: tuple[tuple[str, float], ...]
    location: str | None = None  # the user source the graph came from
    training: bool = False  # a training graph: its forward, or its backward when `backward`
    fusions: tuple[Any, ...] = ()  # loopir's FusionDecision records of every region, in order
    backward: bool = False  # the backward of a training graph, compiled on its first backward call
    compiled_autograd: bool = False  # a whole backward pass handed over by compiled autograd
    collectives: tuple[str, ...] = ()  # collective ops, run as ATen calls between regions in order
    cached: bool = False  # loaded from the whole-graph cache (counts and source are the stored compile's)

    def __str__(self) -> str:
        head = f"graph {self.index}" + (f" ({self.location})" if self.location else "")
        if not self.compiled:
            return f"{head}: ran eagerly: {self.reason}"
        if self.backward:
            head += " [training: backward]"
        elif self.training:
            head += " [training: forward shown, backward compiled on first backward]"
        if self.compiled_autograd:
            head += " [compiled autograd: backward pass]"
        if self.cached:
            head += " [loaded from the whole-graph cache]"
        lines = [f"{head}: {self.kernels} kernels, {self.externs} extern calls, "
                 f"{len(self.lowered_nodes)} ATen nodes lowered, {len(self.fallback_nodes)} fell back to eager"]
        lines += [f"  fallback: {f}" for f in self.fallback_nodes]
        if self.collectives:
            counts = collections.Counter(op.split(".")[1] for op in self.collectives)
            lines.append("  collectives (ATen calls between regions, in graph order): "
                         + ", ".join(f"{n} {name}" for name, n in counts.items()))
        if self.fusions:
            kinds = collections.Counter((d.fused, d.kind) for d in self.fusions)
            lines.append("  fusion: " + ", ".join(f"{n} {'fused' if fused else 'new kernel'} ({kind})"
                                                   for (fused, kind), n in sorted(kinds.items(), reverse=True)))
        return "\n".join(lines + [f"  time: {format_stages(self.stage_seconds)}"])


def format_stages(stage_seconds: tuple[tuple[str, float], ...]) -> str:
    """Stage times, a stage run inside another (``outer/inner``) in brackets after it."""
    def render(prefix: str, depth: int) -> str:
        items = []
        for path, seconds in stage_seconds:
            if path.startswith(prefix) and path.count("/") == depth:
                inner = render(path + "/", depth + 1)
                items.append(f"{path.rsplit('/', 1)[-1]} {seconds * 1000:.0f} ms" + (f" [{inner}]" if inner else ""))
        return ", ".join(items)

    return render("", 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """`explain()`'s answer: one `GraphReport` per graph Dynamo handed to kiln."""

    graphs: tuple[GraphReport, ...]

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def kernel_count(self) -> int:
        return sum(g.kernels for g in self.graphs)

    @property
    def lowered_nodes(self) -> tuple[str, ...]:
        return tuple(op for g in self.graphs for op in g.lowered_nodes)

    @property
    def fallback_nodes(self) -> tuple[FallbackNode, ...]:
        return tuple(f for g in self.graphs for f in g.fallback_nodes)

    @property
    def fallback_ops(self) -> tuple[str, ...]:
        return tuple(f.op for f in self.fallback_nodes)

    @property
    def eager_graphs(self) -> tuple[GraphReport, ...]:
        return tuple(g for g in self.graphs if not g.compiled)

    @property
    def fusions(self) -> tuple[Any, ...]:
        """Every scheduler decision (loopir `FusionDecision`: buffer, kernel, fused, kind, detail)."""
        return tuple(d for g in self.graphs for d in g.fusions)

    @property
    def source(self) -> str:
        return "\n".join(g.source for g in self.graphs if g.source)

    def __str__(self) -> str:
        lines = [f"kiln: {self.graph_count} graphs, {self.kernel_count} generated kernels, "
                 f"{len(self.lowered_nodes)} ATen nodes lowered, {len(self.fallback_nodes)} eager fallbacks"]
        lines += [str(g) for g in self.graphs]
        return "\n".join(lines)
