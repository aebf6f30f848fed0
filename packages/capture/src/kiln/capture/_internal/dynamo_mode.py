"""Dynamo mode: ``CaptureSession`` records what Dynamo compiles while it is open.

The session's backend records every graph (and then runs it unchanged, or hands it to the
backend it wraps). When the session ends, it collects:

* graph breaks from ``torch._dynamo.utils.graph_break_reasons``: every break Dynamo turned
  into a graph cut, with its user stack, including breaks with no graph before them (a
  ``print`` on the first line). If a torch version lacks it, the breaks recorded on the
  captured graphs are used instead;
* breaks that made Dynamo skip a whole frame (a break inside a loop), from
  ``torch._dynamo.utils.counters["unimplemented"]``. These carry no user stack; the
  location is the skipped function's ``def`` line when the message names it;
* recompilations, from Dynamo's compilation metrics (``recompiles.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from kiln.capture._internal.breaks import (
    GraphBreak,
    break_from_compile_reason,
    make_break,
    unique_breaks,
)
from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.recompiles import (
    Recompile,
    compilation_metrics,
    recompiles_from_metrics,
)
from kiln.capture._internal.source import SourceLocation, code_location, read_line

if TYPE_CHECKING:
    from kiln.capture._internal.capture import Capture

log = logging.getLogger(__name__)

_FRAME_SKIP = re.compile(r"frame skipped|skipping frame", re.IGNORECASE)
_SKIPPED_FRAME_INFO = re.compile(
    r"frame skipped: (?P<func>\S+) \((?P<file>.+?) line (?P<line>\d+)\)"
)

Backend = Callable[[torch.fx.GraphModule, Sequence[Any]], Callable]


class CaptureSession:
    """Records the graphs, graph breaks and recompilations of code compiled while open.

    ::

        with CaptureSession() as session:
            f = session.compile(fn)
            f(torch.randn(3))
            f(torch.randn(3, dtype=torch.float64))   # a recompile: dtype guard failed
        result = session.result()                     # a Capture, with .recompiles

    ``session.backend`` is the recording Dynamo backend (pass it to ``torch.compile``);
    ``wrap_backend(inner)`` records and then hands each graph to ``inner``. ``on_graph``
    is called with each ``CapturedGraph`` as it is recorded. ``reset=True`` resets Dynamo
    on entry and exit, so earlier compiles do not leak in and the recorded graphs are not
    kept alive by Dynamo's caches afterwards.
    """

    def __init__(
        self,
        *,
        on_graph: Callable[[CapturedGraph], None] | None = None,
        reset: bool = True,
    ) -> None:
        self.graphs: list[CapturedGraph] = []
        self.functions: list[str] = []
        self._on_graph = on_graph
        self._reset = reset
        self._started = False
        self._baseline_metrics: list[Any] = []
        self._seen_metrics: set[int] = set()
        self._metrics: list[Any] = []
        self._break_start = 0
        self._skips_before: dict[str, int] = {}
        self._fallback: Callable | None = None
        self._breaks: list[GraphBreak] = []

    def __enter__(self) -> CaptureSession:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Begin recording (``with`` does this)."""
        if self._reset:
            torch._dynamo.reset()
        # Keep the earlier metrics alive so that their ids cannot be reused by new ones.
        self._baseline_metrics = compilation_metrics()
        self._seen_metrics = {id(m) for m in self._baseline_metrics}
        self._break_start = len(_graph_break_reasons() or [])
        self._skips_before = _unimplemented_counts()
        self._started = True

    def stop(self) -> None:
        """Stop recording: collect the last metrics, then reset Dynamo if asked."""
        self._poll_metrics()
        self._breaks = self._collect_breaks()
        if self._reset:
            torch._dynamo.reset()
        self._started = False

    def backend(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        """The recording Dynamo backend: records the graph, then runs it unchanged."""
        self.record(gm, example_inputs)
        return gm.forward

    def wrap_backend(self, inner: Backend | str | None) -> Backend:
        """A backend that records each graph, then compiles it with ``inner``."""
        if inner is None:
            return self.backend
        compile_with = torch._dynamo.lookup_backend(inner) if isinstance(inner, str) else inner

        def recording_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
            self.record(gm, example_inputs)
            return compile_with(gm, example_inputs)

        return recording_backend

    def compile(self, fn: Callable, *, dynamic: bool | None = None, **options: Any) -> Callable:
        """``torch.compile(fn, backend=<recording backend>, dynamic=dynamic, **options)``."""
        if not self._started:
            self.start()
        self.functions.append(callable_name(fn))
        if self._fallback is None:
            self._fallback = fn
        return torch.compile(fn, backend=self.backend, dynamic=dynamic, **options)

    def record(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> CapturedGraph:
        """Record one graph (the backends call this)."""
        graph = CapturedGraph.from_backend(gm, example_inputs, index=len(self.graphs))
        self.graphs.append(graph)
        self._poll_metrics()
        if self._on_graph is not None:
            self._on_graph(graph)
        return graph

    def result(self, function: str | None = None) -> Capture:
        """The ``Capture`` of everything recorded so far; ``function`` names it."""
        from kiln.capture._internal.capture import Capture  # capture.py imports this module

        if self._started:
            self._poll_metrics()
            breaks = self._collect_breaks()
        else:
            breaks = self._breaks
        name = function or ", ".join(dict.fromkeys(self.functions)) or "session"
        return Capture(
            graphs=tuple(self.graphs),
            breaks=tuple(breaks),
            mode="dynamo",
            function=name,
            recompiles=tuple(self.recompiles()),
        )

    def recompiles(self) -> list[Recompile]:
        """The recompilations seen so far, in compile order."""
        return recompiles_from_metrics(self._metrics)

    def _poll_metrics(self) -> None:
        # Dynamo keeps only the latest 64 metrics: read them after every graph.
        for metric in compilation_metrics():
            if id(metric) not in self._seen_metrics:
                self._seen_metrics.add(id(metric))
                self._metrics.append(metric)

    def _collect_breaks(self) -> list[GraphBreak]:
        reasons = _graph_break_reasons()
        if reasons is None:
            breaks = [g.graph_break for g in self.graphs if g.graph_break is not None]
        else:
            converted = (break_from_compile_reason(r) for r in reasons[self._break_start :])
            breaks = [b for b in converted if b is not None]
        breaks += _frame_skip_breaks(self._skips_before, self._fallback)
        return unique_breaks(breaks)


def callable_name(fn: Callable) -> str:
    """``SmallNet`` for a module, ``f`` / ``Class.method`` for a function."""
    if isinstance(fn, torch.nn.Module):
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _graph_break_reasons() -> list | None:
    reasons = getattr(torch._dynamo.utils, "graph_break_reasons", None)
    return reasons if isinstance(reasons, list) else None


def _unimplemented_counts() -> dict[str, int]:
    counters = getattr(torch._dynamo.utils, "counters", None)
    if counters is None:
        return {}
    return dict(counters.get("unimplemented", {}))


def _frame_skip_breaks(before: Mapping[str, int], fn: Callable | None) -> list[GraphBreak]:
    """Breaks that made Dynamo skip a whole frame since ``before`` was taken."""
    breaks = []
    for detail, count in _unimplemented_counts().items():
        if count <= before.get(detail, 0) or not _FRAME_SKIP.search(detail):
            continue
        graph_break = make_break(detail, [], fallback_location=_skipped_frame_location(detail, fn))
        reason = f"{graph_break.reason} (Dynamo skipped the whole frame; it ran eagerly)"
        breaks.append(dataclasses.replace(graph_break, reason=reason))
    return breaks


def _skipped_frame_location(detail: str, fn: Callable | None) -> SourceLocation | None:
    match = _SKIPPED_FRAME_INFO.search(detail)
    if match is not None:
        lineno = int(match["line"])
        return SourceLocation(
            match["file"], lineno, match["func"], read_line(match["file"], lineno)
        )
    return code_location(fn) if fn is not None else None
