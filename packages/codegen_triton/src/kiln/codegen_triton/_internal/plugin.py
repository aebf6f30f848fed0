"""codegen_triton as a kiln codegen plugin (`CODEGEN`, entry point ``kiln.codegen`` ``cuda``)."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any

from kiln.loopir import Capabilities, Codegen

from .api import compile
from .options import TritonCodegenError, TritonOptions

_SETTINGS = ("fill_uninitialized", "sync_checks", "autotune")  # backend settings read as they are


def options_from(settings: Mapping[str, Any]) -> TritonOptions:
    """`TritonOptions` from the backend's settings (see `kiln.loopir.Codegen.make_options`)."""
    values = {key: settings[key] for key in _SETTINGS if settings.get(key) is not None}
    if settings.get("cache_dir") is not None:
        values["cache_dir"] = pathlib.Path(settings["cache_dir"]) / "triton"
    return TritonOptions(**values)


def check_device(device: str) -> None:
    """Triton compiles for GPUs; CPU tensors need its interpreter, chosen before it is imported."""
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("codegen='cuda' on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 "
                         "before triton is imported")


CODEGEN = Codegen(
    name="cuda", devices=("cuda",), compile=compile, make_options=options_from,
    # Row temporaries are recomputed in each loop that loads them. On an H200, cuBLAS runs
    # BERT's plain mm faster than its addmm: linears become mm + a bias add in the next kernel.
    # GPUs are memory-bound: cheap values several users read are recomputed, not stored.
    # A long reduction into few outputs (a sum over dim 0) runs in two stages, on enough programs.
    # The one-pass variance (Welford: a row read once, not twice) is correct on an H200 (GPU training
    # gradients included) but slower than two passes: session 13's per-step form 0.75-1.07x in 15 of 18
    # rows of `tools/bench_welford.py --graphs`; session 17's per-lane form (welford_source.py, Inductor's)
    # slower in 17 of 18 rows with whole-row blocks, and with blocks of its own (session 18:
    # `welford_rblock` 1024-4096, 64-256 elements a warp, `tools/sweep_reduction_blocks.py --welford`)
    # still below the two-pass kernels in all 18 rows of var_mean, layer norm and group norm, whose
    # persistent form (the row loaded once, BENCHMARKS.md session 18) reads a row once too. Off.
    # A pointwise kernel stores into the dead matmul output it reads (`Kernel.stored_inputs`): an
    # allocation fewer per such kernel (AMP BERT-base training step: 448 -> 417 a step).
    # Joining earlier kernels (loopir's `join_earlier_kernels`: a BERT layer's forward 12 -> 7
    # kernels) is on: checked on an H200 (gpu_check T5 / Llama / BERT / GPT-2 training gradients, the
    # CUDA integration subset); AMP BERT-base step 678 -> 562 GPU kernels, 5.38 -> 5.08 ms GPU time.
    # Reductions joining earlier kernels for shared inputs are on (a layer norm's weight and bias
    # gradients' partial sums and the next linear's bias gradient in one kernel: 104 -> 83 us a layer
    # in the AMP BERT-base backward, H200). Sibling reductions without shared inputs join too
    # since session 21: with 128-row chunks and 32 x 16 tiles, the query, key and value bias
    # gradients (bf16 [8, 12, 512, 64] read as [8, 512, 768]) take 14.2 us joined, 18.7 us apart
    # (H200, CUDA graph replays), and the AMP BERT-base backward 382 -> 334 kernels, 3132 -> 3093
    # us; under session 20's 8 chunks of 64 x 8 tiles, joined they had taken 48 us against 3 x 3.4.
    # A scatter whose base is a dead kernel or matmul output (an embedding gradient's zero fill)
    # scatters into that memory, not into a copy of it (session 22, checked on an H200).
    capabilities=Capabilities(row_fusion=True, row_temporaries=True, bias_epilogues=True, recompute_cheap=True,
                              split_reductions=True, welford=False, reuse_extern_outputs=True,
                              join_earlier_kernels=True, join_sibling_reductions=True,
                              scatter_into_dead_bases=True),
    errors=(TritonCodegenError,), artifacts_key="kiln_triton", source_suffix=".py", check_device=check_device)
