"""kiln.codegen_cpp: loopir kernel graphs -> C++/OpenMP -> shared library -> callable module."""

import importlib
from typing import Any

from ._internal.build import CppCompileError
from ._internal.options import CppCodegenError, CppOptions
from ._internal.plugin import CODEGEN

__all__ = ["compile", "generate", "verify", "CppOptions", "CppArtifacts", "CppCompileError", "CppCodegenError", "CODEGEN",
           "release_output_pool"]

# The source generators are imported on first use: a process whose kernels all come from kiln's
# whole-graph cache (pickled `CompiledKernel`s re-opening their libraries) never generates C++.
_ON_FIRST_USE = {"compile": "._internal.api", "generate": "._internal.api", "verify": "._internal.api",
                 "CppArtifacts": "._internal.api", "release_output_pool": "._internal.output_pool"}


def __getattr__(name: str) -> Any:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_ON_FIRST_USE[name], __name__), name)
    return value
