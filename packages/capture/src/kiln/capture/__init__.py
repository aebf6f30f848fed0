"""kiln.capture: graph capture with TorchDynamo or torch.export.

``capture(fn, *args)`` returns a ``Capture`` holding every FX graph (``CapturedGraph``)
and every graph break (``GraphBreak``, with the user's source line); ``Capture.report()``
prints them and ``Capture.to_html(path)`` writes a page. A ``CaptureSession`` records
what is compiled while it is open, including recompilations (``Recompile``: which guard
failed and why). ``save(graph, path)`` / ``load(path)`` round-trip a captured graph in one
file. ``CapturedGraph.from_backend`` records a graph from inside any Dynamo backend, and
``verify`` checks a captured graph's contract. ``python -m kiln.capture SCRIPT.py --out DIR``
captures everything a script compiles.
"""

import importlib
from typing import Any

from kiln.capture._internal.breaks import GraphBreak
from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.source import SourceLocation

__all__ = [
    "Capture",
    "CaptureSession",
    "CapturedGraph",
    "GraphBreak",
    "GraphFileError",
    "Recompile",
    "SourceLocation",
    "VerificationError",
    "capture",
    "load",
    "save",
    "verify",
]

# Capturing, reports, graph files and verification are imported on first use: a backend that only
# records the graphs Dynamo hands it (`CapturedGraph.from_backend`) needs none of them.
_ON_FIRST_USE = {
    "Capture": "._internal.capture", "capture": "._internal.capture", "CaptureSession": "._internal.dynamo_mode",
    "GraphFileError": "._internal.graph_codec", "load": "._internal.graph_file", "save": "._internal.graph_file",
    "Recompile": "._internal.recompiles", "VerificationError": "._internal.verify", "verify": "._internal.verify",
}


def __getattr__(name: str) -> Any:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_ON_FIRST_USE[name], __name__), name)
    return value
