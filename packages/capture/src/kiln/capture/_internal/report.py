"""The plain-text report of a ``Capture``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kiln.capture._internal.breaks import GraphBreak
from kiln.capture._internal.graph import CapturedGraph

if TYPE_CHECKING:
    from kiln.capture._internal.capture import Capture

log = logging.getLogger(__name__)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def format_report(result: Capture) -> str:
    """Render: a header, one block per graph (op counts), one block per graph break."""
    lines = [
        f"kiln.capture report: {result.function} (mode={result.mode})",
        f"{_plural(len(result.graphs), 'graph')}, {_plural(len(result.breaks), 'graph break')}",
    ]
    if not result.graphs:
        lines.append("no graph was captured: the function ran entirely in eager Python")
    for graph in result.graphs:
        lines += ["", *_graph_lines(graph)]
    for number, graph_break in enumerate(result.breaks, start=1):
        lines += ["", *_break_lines(number, graph_break)]
    return "\n".join(lines) + "\n"


def _graph_lines(graph: CapturedGraph) -> list[str]:
    where = (
        f", starts at {graph.source.short} in {graph.source.display_function}"
        if graph.source
        else ""
    )
    head = f"graph {graph.index}: {_plural(graph.num_ops, 'op')} ({graph.ir} IR){where}"
    counts = graph.op_counts()
    width = max((len(str(n)) for n in counts.values()), default=1)
    return [head, *(f"  {n:>{width}} x {name}" for name, n in counts.most_common())]


def _break_lines(number: int, graph_break: GraphBreak) -> list[str]:
    lines = [f"graph break {number}: {graph_break.reason}"]
    location = graph_break.location
    if location is not None:
        lines.append(f"  at {location.filename}:{location.lineno} in {location.display_function}")
        if location.code_line:
            lines.append(f"    {location.code_line}")
    else:
        lines.append("  at an unknown location (Dynamo gave no user stack)")
    if graph_break.explanation:
        lines.append(f"  why: {graph_break.explanation}")
    if graph_break.hint:
        lines.append(f"  hint: {graph_break.hint}")
    return lines
