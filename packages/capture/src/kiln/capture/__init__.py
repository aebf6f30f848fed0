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

from kiln.capture._internal.breaks import GraphBreak
from kiln.capture._internal.capture import Capture, capture
from kiln.capture._internal.dynamo_mode import CaptureSession
from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.graph_codec import GraphFileError
from kiln.capture._internal.graph_file import load, save
from kiln.capture._internal.recompiles import Recompile
from kiln.capture._internal.source import SourceLocation
from kiln.capture._internal.verify import VerificationError, verify

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
