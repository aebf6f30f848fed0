"""Pickling `TritonKernel`s, for whole-graph caches such as kiln.integration's.

A kernel's loopir `Kernel` holds closures and its `@triton.jit` function belongs to a module
imported from a generated file, so neither pickles. What is stored instead:

- the kernel's `KernelSignature`: what running it needs of the loopir `Kernel` (its buffers,
  size symbols, outer and reduction sizes, the facts its block-size heuristics read);
- the generated module's source text (one per kernel graph: the kernels of one graph share the
  same string object, which pickle stores once) and the kernel's function name;
- the options, run-time check sites, index bounds and tile it was built with.

Unpickling writes the source back to the options' cache directory unless a copy with the same
checksum is there (`source_cache.write_source`), imports it once per process and rebuilds the
`TritonKernel` through its constructor: no lowering and no code generation. Triton keeps the
binaries it compiles from that source in its own cache (``TRITON_CACHE_DIR``), keyed by the
source and the target, so the first launch in a later process loads them from there.

The cache directory is stored as a string (not a `pathlib.Path`), so a whole-graph cache that
stores paths under its root relative to it (kiln.integration's) can be moved with its sources.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections.abc import Sequence
from typing import Any

import sympy

from kiln.loopir import BufferSpec, Kernel, Reduction
from kiln.loopir.codegen import CheckSite, input_stores, scatter_bases

from .kernel_source import (
    has_reduction,
    has_welford,
    persistent_numel,
    reads_rows_contiguously,
    rereads_rows,
)
from .options import TritonOptions
from .scatter_source import serial_only
from .source_cache import load_module, write_source
from .tiling import Tile


def _numel(sizes: Sequence[sympy.Expr]) -> sympy.Expr:
    return sympy.Mul(*sizes) if sizes else sympy.Integer(1)


@dataclasses.dataclass(frozen=True, slots=True)
class KernelSignature:
    """What running a generated kernel needs of its loopir `Kernel`: its name, buffers and size
    symbols, its outer ranges and each reduction's element count, and what the launch
    heuristics read (whether it reduces, whether it reads rows contiguously, its scatters)."""

    name: str
    inputs: tuple[BufferSpec, ...]
    outputs: tuple[BufferSpec, ...]
    symbols: tuple[sympy.Symbol, ...]
    ranges: tuple[sympy.Expr, ...]
    reduction_numels: tuple[sympy.Expr, ...]  # one per reduction node
    reduction: bool
    contiguous: bool  # see `reads_rows_contiguously`
    scatter_bases: tuple[tuple[int, int], ...]  # see `kiln.loopir.codegen.scatter_bases`
    serial: bool  # see `scatter_source.serial_only`
    holds_rows: bool  # a contiguous reduction kernel that `rereads_rows`
    input_stores: tuple[tuple[int, int], ...] = ()  # see `kiln.loopir.codegen.input_stores`
    welford: bool = False  # it has a `Welford` reduction (its launch takes Welford blocks)
    persistent_numel: int | None = None  # see `kernel_source.persistent_numel`

    @property
    def numel(self) -> sympy.Expr:
        """The number of outer points."""
        return _numel(self.ranges)

    @staticmethod
    def of(kernel: Kernel | KernelSignature) -> KernelSignature:
        if isinstance(kernel, KernelSignature):
            return kernel
        reduction = has_reduction(kernel)
        contiguous = reduction and reads_rows_contiguously(kernel)
        return KernelSignature(
            kernel.name, tuple(kernel.inputs), tuple(kernel.outputs), tuple(kernel.symbols), tuple(kernel.ranges),
            tuple(_numel(n.reduction_ranges) for n in kernel.nodes if isinstance(n.body, Reduction)), reduction,
            contiguous, scatter_bases(kernel), serial_only(kernel), contiguous and rereads_rows(kernel),
            input_stores(kernel), has_welford(kernel), persistent_numel(kernel))


@dataclasses.dataclass(frozen=True, slots=True)
class StoredKernel:
    """A `TritonKernel` as plain data (see the module docstring)."""

    signature: KernelSignature
    source: str  # the generated module's text
    function: str  # the kernel's `@triton.jit` function in it
    cache_dir: str  # the options' cache directory (a string: see the module docstring)
    options: TritonOptions
    checks: tuple[CheckSite, ...]
    index_bounds: tuple[sympy.Expr, ...]
    tile: Tile | None


def stored_kernel(kernel: Any) -> StoredKernel:
    """`kernel` (a `TritonKernel`) as a `StoredKernel`."""
    function = kernel.jit_function.fn
    return StoredKernel(KernelSignature.of(kernel.kernel), _module_source(function.__globals__["__file__"]),
                        function.__name__, str(kernel.options.cache_dir), kernel.options, kernel.checks,
                        kernel.index_bounds, kernel.tile)


@functools.lru_cache(maxsize=64)
def _module_source(path: str) -> str:
    """A generated module's text, the same object for each kernel of it (pickled once)."""
    return pathlib.Path(path).read_text()


def rebuild_kernel(kernel_type: type, stored: StoredKernel) -> Any:
    """`kernel_type(...)` (a `TritonKernel`) run from the stored source: see the module docstring."""
    options = dataclasses.replace(stored.options, cache_dir=pathlib.Path(stored.cache_dir))
    path, _ = write_source(stored.source, options.cache_dir)
    jit_function = getattr(load_module(path), stored.function)
    return kernel_type(stored.signature, jit_function, options, stored.checks, stored.index_bounds, stored.tile)
