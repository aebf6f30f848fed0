"""Public entry points: `generate`, `compile` and `verify`."""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import time

import torch.fx as fx

from kiln.loopir import Kernel, KernelGraph

from .kernel_source import kernel_graph_source
from .options import TritonCodegenError, TritonOptions
from .precompile import precompile
from .runtime import TritonKernel
from .source_cache import load_module, write_source

log = logging.getLogger(__name__)

META_KEY = "kiln_triton"


@dataclasses.dataclass(frozen=True, slots=True)
class TritonArtifacts:
    """What `compile` produced: the source, where it lives, and whether the cache had it."""

    source: str
    source_path: pathlib.Path | None
    cache_hit: bool
    compile_seconds: float
    kernels: tuple[str, ...] = ()


def generate(kernel_graph: KernelGraph, options: TritonOptions | None = None) -> str:
    """The Triton source (one Python module, one `@triton.jit` function per kernel) for
    every kernel of `kernel_graph`. Needs no GPU and does not import triton."""
    return kernel_graph_source(list(kernel_graph.kernels), options)[0]


def compile(kernel_graph: KernelGraph, options: TritonOptions | None = None) -> fx.GraphModule:  # noqa: A001
    """Generate Triton kernels (or load them from the cache) and wire them into a GraphModule.

    The returned module has the calling convention of the ATen graph `kernel_graph` was
    lowered from; its kernel nodes call `TritonKernel` launchers and externs stay ATen calls.
    `module.meta["kiln_triton"]` holds a `TritonArtifacts` record. Raises `TritonCodegenError`
    for what the codegen cannot translate (the message names the kernel and buffer).
    """
    options = options or TritonOptions()
    start = time.perf_counter()
    source, infos = kernel_graph_source(list(kernel_graph.kernels), options)
    if not kernel_graph.kernels:
        module = kernel_graph.with_kernels({})
        module.meta[META_KEY] = TritonArtifacts(source, None, True, 0.0)
        return module
    path, hit = write_source(source, options.cache_dir)
    generated = load_module(path)
    compiled = {k.name: TritonKernel(k, getattr(generated, k.name), options, infos[k.name].checks,
                                     infos[k.name].index_bounds, infos[k.name].tile) for k in kernel_graph.kernels}
    precompile(list(compiled.values()), options.compile_threads)
    module = kernel_graph.with_kernels(compiled)
    seconds = time.perf_counter() - start
    module.meta[META_KEY] = TritonArtifacts(source, path, hit, seconds, tuple(compiled))
    log.info("codegen_triton: %d kernels, %s, in %.2fs (%s)", len(compiled),
             "cache hit" if hit else "new source", seconds, path)
    return module


def verify(module: fx.GraphModule) -> None:
    """Check `compile`'s output contract; raises TritonCodegenError naming the offending node.

    Every kernel call must go to a `TritonKernel` (none left on loopir's reference evaluator),
    take that kernel's number of arguments, and the module must carry its `TritonArtifacts`.
    """
    module.graph.lint()
    artifacts = module.meta.get(META_KEY)
    if not isinstance(artifacts, TritonArtifacts):
        raise TritonCodegenError(f"module has no meta[{META_KEY!r}] record; was it built by "
                                 "kiln.codegen_triton.compile?")
    for node in module.graph.nodes:
        if isinstance(node.target, Kernel):
            raise TritonCodegenError(f"node {node.name} still calls loopir's reference evaluator "
                                     f"for {node.target.name}")
        if isinstance(node.target, TritonKernel):
            kernel = node.target.kernel
            expected = len(kernel.inputs) + len(kernel.symbols)
            if len(node.args) != expected:
                raise TritonCodegenError(f"node {node.name} passes {len(node.args)} arguments to "
                                         f"{kernel.name}, which takes {expected}")
            if kernel.name not in artifacts.kernels:
                raise TritonCodegenError(f"node {node.name} calls {kernel.name}, which is not in the "
                                         "generated source")
