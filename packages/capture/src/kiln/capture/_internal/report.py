"""The plain-text report of a ``Capture``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kiln.capture._internal.breaks import GraphBreak
from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.recompiles import Recompile
from kiln.capture._internal.source import SourceLocation

if TYPE_CHECKING:
    from kiln.capture._internal.capture import Capture

log = logging.getLogger(__name__)

#: Inputs listed one by one in a graph's summary; the rest are counted.
MAX_LISTED_INPUTS = 6


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def format_report(result: Capture) -> str:
    """Render: a header, one block per graph, per graph break and per recompile."""
    counts = f"{plural(len(result.graphs), 'graph')}, {plural(len(result.breaks), 'graph break')}"
    if result.recompiles:
        counts += f", {plural(len(result.recompiles), 'recompile')}"
    lines = [f"kiln.capture report: {result.function} (mode={result.mode})", counts]
    if not result.graphs:
        lines.append("no graph was captured: the function ran entirely in eager Python")
    for graph in result.graphs:
        lines += ["", *graph_lines(graph)]
    for number, graph_break in enumerate(result.breaks, start=1):
        lines += ["", *break_lines(number, graph_break)]
    for number, recompile in enumerate(result.recompiles, start=1):
        lines += ["", *recompile_lines(number, recompile, graphs_of(result, recompile))]
    return "\n".join(lines) + "\n"


def graph_lines(graph: CapturedGraph) -> list[str]:
    where = (
        f", starts at {graph.source.short} in {graph.source.display_function}"
        if graph.source
        else ""
    )
    head = f"graph {graph.index}: {plural(graph.num_ops, 'op')} ({graph.ir} IR){where}"
    compiled = f"compile {graph.compile_id}; " if graph.compile_id else ""
    counts = graph.op_counts()
    width = max((len(str(n)) for n in counts.values()), default=1)
    return [
        head,
        f"  {compiled}inputs: {inputs_summary(graph)}",
        *(f"  {n:>{width}} x {name}" for name, n in counts.most_common()),
    ]


def graphs_of(result: Capture, recompile: Recompile) -> list[CapturedGraph]:
    """The graphs a recompile produced (same Dynamo compile id)."""
    return [g for g in result.graphs if g.compile_id and g.compile_id == recompile.compile_id]


def inputs_summary(graph: CapturedGraph) -> str:
    """``l_x_: f32[s77, 3], s77: int s77 + 39 parameters/buffers``."""
    specs = graph.input_specs()
    user = [spec for spec in specs if not spec.is_parameter]
    parameters = len(specs) - len(user)
    listed = ", ".join(str(spec) for spec in user[:MAX_LISTED_INPUTS]) or "none"
    if len(user) > MAX_LISTED_INPUTS:
        listed += f", ... ({len(user) - MAX_LISTED_INPUTS} more)"
    if parameters:
        listed += f" + {parameters} parameters/buffers"
    return listed


def break_lines(number: int, graph_break: GraphBreak) -> list[str]:
    lines = [f"graph break {number}: {graph_break.reason}"]
    if graph_break.location is not None:
        lines += location_lines(graph_break.location)
    else:
        lines.append("  at an unknown location (Dynamo gave no user stack)")
    if graph_break.explanation:
        lines.append(f"  why: {graph_break.explanation}")
    if graph_break.hint:
        lines.append(f"  hint: {graph_break.hint}")
    return lines


def recompile_lines(
    number: int, recompile: Recompile, graphs: Sequence[CapturedGraph] = ()
) -> list[str]:
    function = recompile.function
    produced = "".join(f" -> graph {graph.index}" for graph in graphs)
    name = function.display_function if function else "a function"
    outcome = (
        "gave up: recompile limit reached"
        if recompile.gave_up
        else f"compile {recompile.compile_id}"
    )
    lines = [f"recompile {number}: {name} ({outcome}{produced})"]
    if function is not None:
        lines.append(f"  function: {function.filename}:{function.lineno}")
    owner = f" of compile {recompile.failed_entry}" if recompile.failed_entry else ""
    lines.append(f"  guard{owner} failed: {recompile.guard}")
    if recompile.location is not None:
        lines += location_lines(recompile.location, "  guarded value used at")
    if recompile.hint:
        lines.append(f"  hint: {recompile.hint}")
    return lines


def location_lines(location: SourceLocation, lead: str = "  at") -> list[str]:
    lines = [f"{lead} {location.filename}:{location.lineno} in {location.display_function}"]
    if location.code_line:
        lines.append(f"    {location.code_line}")
    return lines
