"""`Codegen`: what a code generator for loopir kernel graphs tells the backend about itself.

Every codegen, kiln's own included, is one `Codegen` object registered under the
``kiln.codegen`` entry-point group. The backend picks one by device (or by name), asks its
`Capabilities` how to lower for it, builds its options from the backend's settings with
`make_options`, and catches its `errors` per region. It never compares names. The reference
codegen here runs kernels on loopir's reference evaluator: slow, any device torch runs on,
and the smallest example of the protocol.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from .sizes import SUPPORTED_DTYPES

if TYPE_CHECKING:  # a process that only runs compiled kernels imports no lowering (kiln's graph cache)
    from .kernel_graph import KernelGraph


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    """What a codegen can take, which decides how the backend lowers for it.

    dtypes: tensor dtypes its kernels handle (regions holding others stay eager).
    row_fusion: it emits row nodes (`Kernel.is_row`: pointwise work over a reduction's rows
        run inside the reduction's kernel); without it, loopir lowers with `fuse_rows=False`.
    row_temporaries: it keeps row nodes no other kernel reads itself (`Kernel.row_temporaries`).
    bias_epilogues: linears run best as `mm` plus a bias add fused into the next kernel (the
        backend's default for `KilnOptions.bias_epilogues`).
    recompute_cheap: cheap values read by several users are computed again by each rather than
        stored (`LowerOptions.recompute_cheap`): for memory-bound targets.
    recompute_transcendental: with `recompute_cheap`, values with costly math (exp, ...) are
        recomputed too (`LowerOptions.recompute_transcendental`); False for compute-bound targets.
    split_reductions: long reductions into few outputs run in two stages
        (`LowerOptions.split_reductions`): for targets that need many programs in flight (GPUs).
    welford: it runs `Welford` reductions (ops.reduction's "welford"), so a variance's two
        passes over its values (a mean, then a sum of squared deviations from it) become one
        (`LowerOptions.welford`): for targets whose long rows are read from memory once per pass.
    reuse_extern_outputs: a pointwise node may store into a dead matmul or kernel output it reads
        (`LowerOptions.reuse_extern_outputs`): its runtime honours `Kernel.stored_inputs`.
    scatter_into_dead_bases: a scatter may write into its base's memory where that base is a
        dead matmul or kernel output (`LowerOptions.scatter_into_dead_bases`): its runtime honours
        `Kernel.stored_inputs` for scatter outputs and copies no base onto itself.
    join_earlier_kernels: a pointwise value or reduction may join an earlier kernel holding
        its inputs (`LowerOptions.join_earlier_kernels`).
    join_sibling_reductions: with `join_earlier_kernels`, a reduction may also join an earlier
        kernel with a reduction over the same ranges whose inputs it does not share
        (`LowerOptions.join_sibling_reductions`).
    """

    dtypes: frozenset[torch.dtype] = SUPPORTED_DTYPES
    row_fusion: bool = False
    row_temporaries: bool = False
    bias_epilogues: bool = False
    recompute_cheap: bool = False
    split_reductions: bool = False
    recompute_transcendental: bool = True
    welford: bool = False
    reuse_extern_outputs: bool = False
    scatter_into_dead_bases: bool = False
    join_earlier_kernels: bool = True
    join_sibling_reductions: bool = True


def _no_options(settings: Mapping[str, Any]) -> None:
    return None


def _no_check(device: str) -> None:
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Codegen:
    """A codegen as the backend sees it.

    name: what `KilnOptions.codegen` names it by (also the entry point's name).
    devices: the torch device types whose graphs it compiles by default.
    compile: ``compile(kernel_graph, options) -> nn.Module`` with the kernel graph's calling
        convention.
    make_options: the backend's settings (a mapping of `KilnOptions` field names to values:
        cache_dir, fill_uninitialized, openmp, ...) -> this codegen's own options object; it
        reads the keys it knows and ignores the rest.
    capabilities: see `Capabilities`.
    errors: what `compile` raises for a kernel graph it cannot take (the backend runs that
        region eagerly, or re-raises with `fallback=False`).
    artifacts_key: the key of `module.meta` where `compile` leaves a record with a `source`.
    source_suffix: the file suffix of that source, for debug dumps.
    check_device: raises ValueError when it cannot compile for a device (named explicitly).
    allocate_output: ``allocate_output(size, stride, dtype) -> Tensor``, or None: where the
        codegen's kernels get their large outputs (codegen_cpp: a pool of resident storages).
        The backend then gives the ATen matmuls of its graphs (outside the regions) their
        outputs from it too, through their ``out=`` overloads.
    """

    name: str
    devices: tuple[str, ...]
    compile: Callable[[KernelGraph, Any], torch.nn.Module]
    make_options: Callable[[Mapping[str, Any]], Any] = _no_options
    capabilities: Capabilities = Capabilities()
    errors: tuple[type[Exception], ...] = ()
    artifacts_key: str = ""
    source_suffix: str = ".txt"
    check_device: Callable[[str], None] = _no_check
    allocate_output: Callable[[Any, Any, torch.dtype], torch.Tensor] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ReferenceArtifacts:
    """What the reference codegen leaves in `module.meta["kiln_reference"]`."""

    source: str


def _reference_compile(kernel_graph: KernelGraph, options: Any = None) -> fx.GraphModule:
    """The kernel graph's own module: its kernel nodes call loopir's reference evaluator."""
    module = kernel_graph.with_kernels({k.name: k for k in kernel_graph.kernels})
    module.meta["kiln_reference"] = ReferenceArtifacts(str(kernel_graph))
    return module


REFERENCE_CODEGEN = Codegen(
    name="reference", devices=(), compile=_reference_compile,
    capabilities=Capabilities(row_fusion=True, row_temporaries=True),
    artifacts_key="kiln_reference")
