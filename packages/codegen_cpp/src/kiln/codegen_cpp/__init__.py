"""kiln.codegen_cpp: loopir kernel graphs -> C++/OpenMP -> shared library -> callable module."""

from ._internal.api import CppArtifacts, compile, generate, verify
from ._internal.build import CppCompileError
from ._internal.options import CppCodegenError, CppOptions
from ._internal.plugin import CODEGEN

__all__ = ["compile", "generate", "verify", "CppOptions", "CppArtifacts", "CppCompileError", "CppCodegenError", "CODEGEN"]
