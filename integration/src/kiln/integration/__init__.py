"""kiln.integration: the `kiln` torch.compile backend, wiring every kiln stage together.

`torch.compile(model, backend="kiln")` works without importing kiln (entry point
`torch_dynamo_backends`). `explain(fn, *args)` reports what became generated kernels and what
fell back to eager, with the generated source. `bisect(fn, *args)` names the first pipeline
stage whose result differs from eager's (and the region and kernel) and writes a repro. Debug
modes: `verify_calls` (compiled regions compared with eager, naming the first kernel that
differs: `RegionMismatchError`) and `fill_uninitialized` (kernel outputs NaN-filled before they
are written).
"""

from ._internal.backend import backend, explain
from ._internal.bisect import BisectResult, bisect
from ._internal.checked import RegionMismatchError
from ._internal.options import KilnOptions, OptionsError
from ._internal.report import FallbackNode, GraphReport, Report

__all__ = ["backend", "explain", "bisect", "BisectResult", "KilnOptions", "OptionsError", "Report", "GraphReport",
           "FallbackNode", "RegionMismatchError"]
