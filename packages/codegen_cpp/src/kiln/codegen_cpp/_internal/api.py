"""`compile(kernel_graph, options) -> nn.Module`: the C++/OpenMP codegen's entry point."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import time

import torch.fx as fx

from kiln.loopir import Kernel, KernelGraph

from .build import CppCompileError, build_library, load_library
from .function_source import kernel_graph_source
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
    return kernel_graph_source(list(kernel_graph.kernels), options or CppOptions())[0]


def compile(kernel_graph: KernelGraph, options: CppOptions | None = None) -> fx.GraphModule:  # noqa: A001
    """Generate, build (or load from cache) and wire C++ kernels into a runnable GraphModule.

    The returned module has the calling convention of the ATen graph `kernel_graph` was
    lowered from; `module.meta["kiln_cpp"]` holds a `CppArtifacts` record.
    """
    options = options or CppOptions()
    start = time.perf_counter()
    source, checks = kernel_graph_source(list(kernel_graph.kernels), options)
    if not kernel_graph.kernels:
        module = kernel_graph.with_kernels({})
        module.meta["kiln_cpp"] = CppArtifacts(source, None, None, True, 0.0)
        return module
    try:
        library_path, hit = build_library(source, options)
    except CppCompileError:
        if not options.vector_math:
            raise
        log.warning("codegen_cpp: building with libmvec failed; rebuilding without vector math")
        options = dataclasses.replace(options, vector_math=False)
        source, checks = kernel_graph_source(list(kernel_graph.kernels), options)
        library_path, hit = build_library(source, options)
    library = load_library(library_path)
    compiled = {k.name: CompiledKernel(k, library, options.check_strides, checks[k.name], options.fill_uninitialized)
                for k in kernel_graph.kernels}
    module = kernel_graph.with_kernels(compiled)
    seconds = time.perf_counter() - start
    module.meta["kiln_cpp"] = CppArtifacts(source, library_path.parent / "kernels.cpp", library_path, hit, seconds)
    log.info("codegen_cpp: %d kernels, %s in %.2fs", len(compiled), "cache hit" if hit else "built", seconds)
    return module


def verify(module: fx.GraphModule) -> None:
    """Check what `compile` returned: a well-formed graph whose every kernel call runs compiled
    C++ (none left on loopir's reference evaluator) and a `CppArtifacts` record in its meta.
    Raises ValueError naming the offending node."""
    module.graph.lint()
    artifacts = module.meta.get("kiln_cpp")
    if not isinstance(artifacts, CppArtifacts):
        raise ValueError("module.meta['kiln_cpp'] is missing: was this module built by kiln.codegen_cpp.compile?")
    for node in module.graph.nodes:
        if node.op != "call_function":
            continue
        if isinstance(node.target, Kernel):
            raise ValueError(f"node {node.name} still calls loopir kernel {node.target.name} (reference "
                             "evaluator), not compiled C++")
        if isinstance(node.target, CompiledKernel) and node.target.kernel.name not in artifacts.source:
            raise ValueError(f"node {node.name} calls {node.target.kernel.name}, which the module's source lacks")
