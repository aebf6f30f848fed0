"""kiln.loopir: a define-by-run loop-level IR.

`lower(gm)` turns a functional ATen graph into a `KernelGraph`: fused `Kernel`s of
`Pointwise`/`Reduction` loop bodies plus extern calls (mm, addmm, bmm). Loop bodies are
written against an ops handler passed in explicitly; `ReadsWrites`, `Printer`, the reference
evaluator (calling a `Kernel`) and the codegens are such handlers. A codegen describes itself to
the backend as a `Codegen` (name, devices, options, `Capabilities`, errors), registered under the
``kiln.codegen`` entry-point group; `REFERENCE_CODEGEN` runs kernels on the reference evaluator.
"""

from ._internal.api import LowerOptions, lower, verify
from ._internal.ir import BufferSpec, ComputedBuffer, Kernel, Pointwise, Reduction, Scan, Scatter
from ._internal.kernel_graph import KernelGraph
from ._internal.lower import SUPPORTED_DTYPES, ExternCall, LoweringError, node_location
from ._internal.ops import OPS, SCATTER_MODES, OpsHandler
from ._internal.plugin import REFERENCE_CODEGEN, Capabilities, Codegen
from ._internal.registry import Lowerings, default_lowerings, lowerable, supported_ops
from ._internal.schedule import FusionDecision
from ._internal.simplify import simplify_index
from ._internal.sizes import FloorDiv, index_vars, indirect_var
from ._internal.uninitialized import fill_requested, fill_uninitialized

__all__ = [
    "lower", "verify", "supported_ops", "lowerable", "KernelGraph", "Kernel", "ComputedBuffer", "Pointwise",
    "Reduction", "Scan", "Scatter", "BufferSpec", "ExternCall", "LoweringError", "OpsHandler", "OPS", "SCATTER_MODES", "FloorDiv", "index_vars",
    "indirect_var", "simplify_index", "fill_requested", "fill_uninitialized", "SUPPORTED_DTYPES", "Codegen",
    "Capabilities", "REFERENCE_CODEGEN", "LowerOptions", "Lowerings", "default_lowerings",
    "FusionDecision", "node_location",
]
