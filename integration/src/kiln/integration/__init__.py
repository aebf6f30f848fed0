"""kiln.integration: the `kiln` torch.compile backend, wiring every kiln stage together.

`torch.compile(model, backend="kiln")` works without importing kiln (entry point
`torch_dynamo_backends`). `explain(fn, *args)` reports what became generated kernels and what
fell back to eager, with the generated source.
"""

from ._internal.backend import backend, explain
from ._internal.options import KilnOptions, OptionsError
from ._internal.report import FallbackNode, GraphReport, Report

__all__ = ["backend", "explain", "KilnOptions", "OptionsError", "Report", "GraphReport", "FallbackNode"]
