"""Host overhead per kernel launch on a GPU: a 4-kernel graph on tiny tensors, where the
device work is negligible and the time is Python (checks, allocation, dispatch, launch).

    PYTHONPATH=packages/loopir/src:packages/codegen_triton/src python packages/codegen_triton/tools/bench_launch.py

Prints the median wall time of one whole module call (with a synchronize) and of one bare
`TritonKernel` call (no synchronize: launches are asynchronous), in microseconds.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonOptions, compile
from kiln.loopir import lower


def four_kernels(x, y):
    a = torch.sigmoid(x) * y
    b = (a / a.sum(-1, keepdim=True)).t() + 1
    return torch.tanh(b.amax(0)) * 2, b.sum(0)


def median_us(fn, repeat: int = 2000, sync: bool = True) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    x, y = torch.randn(8, 16, device="cuda"), torch.randn(8, 16, device="cuda")
    kernel_graph = lower(make_fx(four_kernels)(x, y), fuse_rows=False)
    module = compile(kernel_graph, TritonOptions(cache_dir=tempfile.mkdtemp(prefix="kiln-launch-")))
    torch.testing.assert_close(module(x, y), four_kernels(x, y))
    first = next(n.target for n in module.graph.nodes if type(n.target).__name__ == "TritonKernel")
    eager = median_us(lambda: four_kernels(x, y))
    whole = median_us(lambda: module(x, y))
    bare = median_us(lambda: first(x, y), sync=False)
    sync = median_us(lambda: torch.cuda.synchronize(), sync=False)
    direct = getattr(getattr(first, "_launcher", None), "direct", "n/a")  # n/a: a codegen before launch.py
    print(f"{len(kernel_graph.kernels)} kernels: eager {eager:.1f} us/call, kiln module {whole:.1f} us/call, "
          f"one TritonKernel call {bare:.1f} us (no sync), a bare synchronize {sync:.1f} us; "
          f"direct launches: {direct}")


if __name__ == "__main__":
    main()
