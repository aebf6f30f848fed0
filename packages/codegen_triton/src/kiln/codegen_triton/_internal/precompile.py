"""Compiling a graph's kernels in threads before its first call.

Without it, each kernel compiles at its first launch, so a graph's first call compiles its
kernels one after another: seconds per dozen kernels, the larger part of a cold compile on a
GPU. When every size of a kernel is known (no size symbols), its launch plan, and so Triton's
specialization, is known right after codegen: `JITFunction.warmup` compiles it from the
argument dtypes (pointers assumed 16-byte aligned, as fresh allocations are) without launching.
The compiled binary lands in the JITFunction's own cache, where the first launch finds it; a
launch whose specialization differs (a misaligned view) compiles at that launch, as before.
Failures only lose the head start: the first launch compiles and reports them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Sequence

import torch

from .runtime import TritonKernel

log = logging.getLogger(__name__)


def _warmup(kernel: TritonKernel, device: int) -> None:
    args, grid, launch = kernel.warmup_arguments()
    with torch.cuda.device(device):
        kernel.jit_function.warmup(*args, grid=grid, **launch)


def precompile(kernels: Sequence[TritonKernel], threads: int) -> int:
    """Compile the kernels of `kernels` that can be, with `threads` threads, for the current
    CUDA device; returns how many compiled. Does nothing without a CUDA device."""
    if threads <= 1 or not torch.cuda.is_available():
        return 0
    ready = [k for k in kernels if k.can_precompile()]
    if not ready:
        return 0
    device = torch.cuda.current_device()
    start = time.perf_counter()
    done = 0
    with concurrent.futures.ThreadPoolExecutor(min(threads, len(ready)), thread_name_prefix="kiln-triton") as pool:
        futures = {pool.submit(_warmup, k, device): k for k in ready}
        for future in concurrent.futures.as_completed(futures):
            try:
                future.result()
                done += 1
            except Exception as error:  # noqa: BLE001 - the first launch compiles again and reports it
                log.debug("codegen_triton: precompiling %s failed (%s); it compiles at its first launch",
                          futures[future].__name__, error)
    log.info("codegen_triton: %d of %d kernels compiled by %d threads in %.2fs", done, len(ready),
             min(threads, len(ready)), time.perf_counter() - start)
    return done
