"""kiln.codegen_triton: loopir kernel graphs -> Triton source -> GPU kernels -> callable module.

`generate(kernel_graph)` returns the readable source (one `@triton.jit` function per loopir
kernel); `compile(kernel_graph)` writes it to the cache, imports it and returns an FX
GraphModule calling the kernels. Runs on CPU tensors under the Triton interpreter
(``TRITON_INTERPRET=1`` set before triton is imported).
"""

from ._internal.api import TritonArtifacts, compile, generate, verify
from ._internal.options import TritonCodegenError, TritonOptions
from ._internal.plugin import CODEGEN

__all__ = ["compile", "generate", "verify", "TritonOptions", "TritonArtifacts", "TritonCodegenError", "CODEGEN"]
