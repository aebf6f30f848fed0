"""kiln.loopir: a define-by-run loop-level IR.

`lower(gm)` turns a functional ATen graph into a `KernelGraph`: fused `Kernel`s of
`Pointwise`/`Reduction` loop bodies plus extern calls (mm, addmm, bmm). Loop bodies are
written against an ops handler passed in explicitly; `ReadsWrites`, `Printer`, the reference
evaluator (calling a `Kernel`) and the codegens are such handlers. A codegen describes itself to
the backend as a `Codegen` (name, devices, options, `Capabilities`, errors), registered under the
``kiln.codegen`` entry-point group; `REFERENCE_CODEGEN` runs kernels on the reference evaluator.
"""

import importlib
from typing import Any

from ._internal.fusion_records import FusionDecision
from ._internal.ir import BufferSpec, ComputedBuffer, Kernel, Pointwise, Reduction, Scan, Scatter
from ._internal.ops import OPS, SCATTER_MODES, OpsHandler
from ._internal.plugin import REFERENCE_CODEGEN, Capabilities, Codegen
from ._internal.simplify import simplify_index
from ._internal.sizes import SUPPORTED_DTYPES, FloorDiv, index_vars, indirect_var
from ._internal.uninitialized import fill_requested, fill_uninitialized

__all__ = [
    "lower", "verify", "supported_ops", "lowerable", "KernelGraph", "Kernel", "ComputedBuffer", "Pointwise",
    "Reduction", "Scan", "Scatter", "BufferSpec", "ExternCall", "LoweringError", "OpsHandler", "OPS", "SCATTER_MODES", "FloorDiv", "index_vars",
    "indirect_var", "simplify_index", "fill_requested", "fill_uninitialized", "SUPPORTED_DTYPES", "Codegen",
    "Capabilities", "REFERENCE_CODEGEN", "LowerOptions", "Lowerings", "default_lowerings",
    "FusionDecision", "node_location", "stored_positions",
]

# Lowering, the kernel graph and the lowering tables are imported on first use: a process that only
# runs compiled kernels (every graph a hit of kiln.integration's whole-graph cache) needs the IR
# records above, not the passes that build them.
_ON_FIRST_USE = {
    "lower": "._internal.api", "verify": "._internal.api", "LowerOptions": "._internal.api",
    "KernelGraph": "._internal.kernel_graph",
    "ExternCall": "._internal.lower", "LoweringError": "._internal.lower", "node_location": "._internal.lower",
    "Lowerings": "._internal.registry", "default_lowerings": "._internal.registry",
    "lowerable": "._internal.registry", "supported_ops": "._internal.registry",
    "stored_positions": "._internal.input_stores",
}


def __getattr__(name: str) -> Any:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_ON_FIRST_USE[name], __name__), name)
    return value
