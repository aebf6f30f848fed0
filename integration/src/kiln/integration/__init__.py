"""kiln.integration: the `kiln` torch.compile backend, wiring every kiln stage together.

`torch.compile(model, backend="kiln")` works without importing kiln (entry point
`torch_dynamo_backends`). `explain(fn, *args)` reports what became generated kernels and what
fell back to eager, with the generated source. `bisect(fn, *args)` names the first pipeline
stage whose result differs from eager's (and the region and kernel) and writes a repro. Debug
modes: `verify_calls` (compiled regions compared with eager, naming the first kernel that
differs: `RegionMismatchError`) and `fill_uninitialized` (kernel outputs NaN-filled before they
are written). `save_cache(path)` / `load_cache(path)` ship the whole-graph cache to another
machine of the same kind.
"""

import importlib
from typing import Any

from ._internal.backend import backend, explain
from ._internal.options import KilnOptions, OptionsError
from ._internal.report import FallbackNode, GraphReport, Report

__all__ = ["backend", "explain", "bisect", "BisectResult", "KilnOptions", "OptionsError", "Report", "GraphReport",
           "FallbackNode", "RegionMismatchError", "save_cache", "load_cache"]

# Imported on first use: bisect imports the whole compile pipeline, which `backend` defers to
# its first cache miss (a process whose graphs all come from the cache never imports it); the
# region checks and the cache's archives are not needed to run cached graphs either.
_ON_FIRST_USE = {"bisect": "._internal.bisect", "BisectResult": "._internal.bisect",
                 "RegionMismatchError": "._internal.checked", "save_cache": "._internal.cache_archive",
                 "load_cache": "._internal.cache_archive"}


def __getattr__(name: str) -> Any:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_ON_FIRST_USE[name], __name__), name)
    return value
