"""codegen_cpp as a kiln codegen plugin (`CODEGEN`, entry point ``kiln.codegen`` ``cpu``)."""

from __future__ import annotations

import importlib
import pathlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from kiln.loopir import Capabilities, Codegen

from .build import CppCompileError
from .options import CppCodegenError, CppOptions
from .output_pool import POOL

if TYPE_CHECKING:
    from kiln.loopir import KernelGraph

DTYPES = frozenset({torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                    torch.bool, torch.bfloat16, torch.float16})
_SETTINGS = ("openmp", "parallel_threshold", "fill_uninitialized")  # backend settings read as they are


def options_from(settings: Mapping[str, Any]) -> CppOptions:
    """`CppOptions` from the backend's settings (see `kiln.loopir.Codegen.make_options`)."""
    values = {key: settings[key] for key in _SETTINGS if settings.get(key) is not None}
    if settings.get("cache_dir") is not None:
        values["cache_dir"] = pathlib.Path(settings["cache_dir"]) / "cpp"
    return CppOptions(**values)


def compile_kernel_graph(kernel_graph: KernelGraph, options: CppOptions | None = None) -> torch.nn.Module:
    """`kiln.codegen_cpp.compile`, its module imported on the first compile: a process whose kernels
    all come from kiln's whole-graph cache never imports the C++ source generators."""
    return importlib.import_module(f"{__package__}.api").compile(kernel_graph, options)


CODEGEN = Codegen(
    name="cpu", devices=("cpu",), compile=compile_kernel_graph, make_options=options_from,
    # rows in a per-thread scratch row; bfloat16/float16 stored as 16 bits, computed in float;
    # cheap arithmetic read by several loops is recomputed by each (a batch norm's centred input),
    # costly math (a softmax's exp) is stored once: a CPU's vector exp costs more than its load;
    # a pointwise node after a matmul writes into the matmul's dead output (its cache lines are
    # resident: no write-allocate of a fresh buffer)
    capabilities=Capabilities(dtypes=DTYPES, row_fusion=True, row_temporaries=True, recompute_cheap=True,
                              recompute_transcendental=False, reuse_extern_outputs=True,
                              scatter_into_dead_bases=True),
    errors=(CppCompileError, CppCodegenError), artifacts_key="kiln_cpp", source_suffix=".cpp",
    allocate_output=POOL.allocate)  # the backend's ATen matmul outputs come from the same pool
