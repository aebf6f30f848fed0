"""kiln.capture: graph capture with TorchDynamo or torch.export.

``capture(fn, *args)`` returns a ``Capture`` holding every FX graph (``CapturedGraph``)
and every graph break (``GraphBreak``, with the user's source line); ``Capture.report()``
prints them. ``CapturedGraph.from_backend`` records a graph from inside any Dynamo
backend, and ``verify`` checks a captured graph's contract.
"""

from kiln.capture._internal.breaks import GraphBreak
from kiln.capture._internal.capture import Capture, capture
from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.source import SourceLocation
from kiln.capture._internal.verify import VerificationError, verify

__all__ = [
    "Capture",
    "CapturedGraph",
    "GraphBreak",
    "SourceLocation",
    "VerificationError",
    "capture",
    "verify",
]
