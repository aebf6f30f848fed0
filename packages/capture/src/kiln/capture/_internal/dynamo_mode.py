"""Dynamo mode: run the function under ``torch.compile`` with a recording backend.

Graph breaks come from two places, so that none is missed:

* ``torch._dynamo.utils.graph_break_reasons``: every break Dynamo turned into a graph cut,
  with its user stack, including breaks with no graph before them (a ``print`` on the
  first line). Cleared by ``torch._dynamo.reset()``. If a torch version lacks it, the
  breaks recorded on the captured graphs are used instead.
* ``torch._dynamo.utils.counters["unimplemented"]``: failures that made Dynamo skip a whole
  frame (a break inside a loop). These carry no user stack; the location is the skipped
  function's ``def`` line when the message names it, else the captured function's.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from kiln.capture._internal.breaks import (
    GraphBreak,
    break_from_compile_reason,
    make_break,
    unique_breaks,
)
from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.source import SourceLocation, code_location, read_line

log = logging.getLogger(__name__)

_FRAME_SKIP = re.compile(r"frame skipped|skipping frame", re.IGNORECASE)
_SKIPPED_FRAME_INFO = re.compile(
    r"frame skipped: (?P<func>\S+) \((?P<file>.+?) line (?P<line>\d+)\)"
)


class GraphRecorder:
    """A Dynamo backend that records every graph and runs it unchanged (eagerly)."""

    def __init__(self) -> None:
        self.graphs: list[CapturedGraph] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        self.graphs.append(CapturedGraph.from_backend(gm, example_inputs, index=len(self.graphs)))
        return gm.forward


def capture_dynamo(
    fn: Callable, args: Sequence[Any], kwargs: Mapping[str, Any], dynamic: bool | None
) -> tuple[list[CapturedGraph], list[GraphBreak]]:
    """Run ``fn(*args, **kwargs)`` under Dynamo; return the graphs and the graph breaks."""
    torch._dynamo.reset()
    skips_before = _unimplemented_counts()
    recorder = GraphRecorder()
    try:
        torch.compile(fn, backend=recorder, dynamic=dynamic)(*args, **kwargs)
        breaks = _dynamo_breaks(recorder.graphs) + _frame_skip_breaks(skips_before, fn)
    finally:
        # The cache entries hold the recorder and its graphs; drop them.
        torch._dynamo.reset()
    log.debug("dynamo captured %d graphs, %d breaks", len(recorder.graphs), len(breaks))
    return recorder.graphs, unique_breaks(breaks)


def _dynamo_breaks(graphs: Sequence[CapturedGraph]) -> list[GraphBreak]:
    reasons = getattr(torch._dynamo.utils, "graph_break_reasons", None)
    if not isinstance(reasons, list):
        return [g.graph_break for g in graphs if g.graph_break is not None]
    converted = (break_from_compile_reason(reason) for reason in reasons)
    return [b for b in converted if b is not None]


def _unimplemented_counts() -> dict[str, int]:
    counters = getattr(torch._dynamo.utils, "counters", None)
    if counters is None:
        return {}
    return dict(counters.get("unimplemented", {}))


def _frame_skip_breaks(before: Mapping[str, int], fn: Callable) -> list[GraphBreak]:
    """Breaks that made Dynamo skip a whole frame during this run."""
    breaks = []
    for detail, count in _unimplemented_counts().items():
        if count <= before.get(detail, 0) or not _FRAME_SKIP.search(detail):
            continue
        graph_break = make_break(detail, [], fallback_location=_skipped_frame_location(detail, fn))
        reason = f"{graph_break.reason} (Dynamo skipped the whole frame; it ran eagerly)"
        breaks.append(dataclasses.replace(graph_break, reason=reason))
    return breaks


def _skipped_frame_location(detail: str, fn: Callable) -> SourceLocation | None:
    match = _SKIPPED_FRAME_INFO.search(detail)
    if match is not None:
        lineno = int(match["line"])
        return SourceLocation(
            match["file"], lineno, match["func"], read_line(match["file"], lineno)
        )
    return code_location(fn)
