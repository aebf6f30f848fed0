"""`compile(kernel_graph, options) -> nn.Module`: the C++/OpenMP codegen's entry point."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import time

import torch.fx as fx

from kiln.loopir import KernelGraph

from .build import build_library, load_library
from .kernel_source import kernel_graph_source
from .options import CppOptions
from .runtime import CompiledKernel

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class CppArtifacts:
    """What `compile` produced: the source, where it lives, and whether the cache had it."""

    source: str
    source_path: pathlib.Path | None
    library_path: pathlib.Path | None
    cache_hit: bool
    compile_seconds: float


def generate(kernel_graph: KernelGraph, options: CppOptions | None = None) -> str:
    """The C++ source for every kernel of `kernel_graph` (one translation unit)."""
    return kernel_graph_source(list(kernel_graph.kernels), options or CppOptions())


def compile(kernel_graph: KernelGraph, options: CppOptions | None = None) -> fx.GraphModule:  # noqa: A001
    """Generate, build (or load from cache) and wire C++ kernels into a runnable GraphModule.

    The returned module has the calling convention of the ATen graph `kernel_graph` was
    lowered from; `module.meta["kiln_cpp"]` holds a `CppArtifacts` record.
    """
    options = options or CppOptions()
    start = time.perf_counter()
    source = generate(kernel_graph, options)
    if not kernel_graph.kernels:
        module = kernel_graph.with_kernels({})
        module.meta["kiln_cpp"] = CppArtifacts(source, None, None, True, 0.0)
        return module
    library_path, hit = build_library(source, options)
    library = load_library(library_path)
    compiled = {k.name: CompiledKernel(k, library, options.check_strides) for k in kernel_graph.kernels}
    module = kernel_graph.with_kernels(compiled)
    seconds = time.perf_counter() - start
    module.meta["kiln_cpp"] = CppArtifacts(source, library_path.parent / "kernels.cpp", library_path, hit, seconds)
    log.info("codegen_cpp: %d kernels, %s in %.2fs", len(compiled), "cache hit" if hit else "built", seconds)
    return module
