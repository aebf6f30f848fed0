"""``capture()``: the package's entry point, and the ``Capture`` record it returns."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from kiln.capture._internal.breaks import GraphBreak
from kiln.capture._internal.dynamo_mode import CaptureSession, callable_name
from kiln.capture._internal.export_mode import capture_export
from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.recompiles import Recompile
from kiln.capture._internal.report import format_report

log = logging.getLogger(__name__)

CaptureMode = Literal["dynamo", "export"]
MODES: tuple[CaptureMode, ...] = ("dynamo", "export")


@dataclass(frozen=True, slots=True, eq=False)
class Capture:
    """Everything one capture run found.

    ``graphs`` in capture order; ``breaks`` in the order Dynamo met them (always empty in
    export mode, which fails instead of breaking); ``mode`` the frontend used; ``function``
    the captured callable's name; ``exported_program`` the ``ExportedProgram`` in export
    mode, else None; ``recompiles`` the recompilations seen (a ``CaptureSession`` that
    calls a function again with other shapes or dtypes has some; ``capture()`` calls once).
    """

    graphs: tuple[CapturedGraph, ...]
    breaks: tuple[GraphBreak, ...]
    mode: CaptureMode
    function: str
    exported_program: torch.export.ExportedProgram | None = None
    recompiles: tuple[Recompile, ...] = ()

    def report(self) -> str:
        """A human-readable summary: graphs, ops per graph, breaks and recompiles with their
        source lines."""
        return format_report(self)

    def to_html(self, path: str | os.PathLike[str]) -> Path:
        """Write a self-contained HTML page (graphs as code linked to the user's source
        lines, breaks and recompiles highlighted) to ``path``; return the path."""
        from kiln.capture._internal.html_report import write_html

        return write_html(self, Path(path))

    def __str__(self) -> str:
        return (
            f"Capture({self.function}: {len(self.graphs)} graphs, {len(self.breaks)} breaks, "
            f"{len(self.recompiles)} recompiles)"
        )


def capture(
    fn: Callable,
    *args: Any,
    mode: CaptureMode = "dynamo",
    dynamic: bool | None = None,
    **kwargs: Any,
) -> Capture:
    """Capture the FX graphs of ``fn(*args, **kwargs)``.

    ``mode="dynamo"`` resets Dynamo, runs ``fn`` once under ``torch.compile`` with a
    recording backend (the graphs run eagerly, so side effects such as prints happen once)
    and records every graph in Torch IR and every graph break. ``mode="export"`` runs
    ``torch.export.export`` (``fn`` may be an ``nn.Module`` or a function) and records one
    ATen graph; export errors propagate. ``dynamic`` is passed to ``torch.compile``; in
    export mode ``True`` makes every tensor dimension ``Dim.AUTO``. To see recompilations,
    call a function several times inside a ``CaptureSession``.

    ``fn``'s own keyword arguments named ``mode`` or ``dynamic`` cannot be passed here.
    """
    if mode not in MODES:
        raise ValueError(f"kiln.capture: unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    name = callable_name(fn)
    if mode == "export":
        graph, program = capture_export(fn, args, kwargs, dynamic)
        return Capture((graph,), (), mode, name, program)
    with CaptureSession() as session:
        session.compile(fn, dynamic=dynamic)(*args, **kwargs)
    result = session.result(name)
    log.info("captured %s", result)
    return result
