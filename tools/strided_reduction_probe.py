"""Strided (column) reductions through kiln's GPU lowering, timed with a few strided block
options against Inductor (session 21, BENCHMARKS.md: why codegen_triton's strided reductions
take 32 x 16 tiles, and 64 x 16 for long chunks of 2-byte values).

    PYTHONPATH=<packages/*/src>:integration/src:tools python tools/strided_reduction_probe.py   # on a GPU

Cases: a layer norm backward's weight and bias gradients (`(g * (x - mean) * rstd).sum(rows)`
and `g.sum(rows)`, float32, the training step's class of short 128-row chunks) and sums over
dim 0 at several shapes in float32 and bfloat16. Each cell is microseconds of a CUDA graph
replay (`bench_gpu_rows.bench`) of the whole compiled graph (both split stages); a variant's
options override the codegen's heuristics for every strided kernel.
"""

from __future__ import annotations

import functools
import os
import pathlib
import tempfile

import torch

os.environ.setdefault("BENCH_GRAPHS", "1")
from bench_gpu_rows import bench  # noqa: E402
from sweep_reduction_blocks import kernel_graph, microseconds  # noqa: E402

from kiln.codegen_triton import TritonOptions  # noqa: E402

VARIANTS = (("32x16", {"strided_xblock": 32}), ("64x8", {"strided_xblock": 64}),
            ("32x8", {"strided_xblock": 32, "strided_tile": 256}), ("64x16", {"strided_xblock": 64, "strided_tile": 1024}))


def layer_norm_weight_grads(g, x, mean, rstd):
    rows = tuple(range(g.dim() - 1))
    return (g * (x - mean) * rstd).sum(rows), g.sum(rows)


def column_sum(g):
    return g.sum(0)


def cases():
    for shape in ((8, 512, 768), (32, 512, 768), (4096, 3072)):
        g, x = torch.randn(*shape, device="cuda"), torch.randn(*shape, device="cuda")
        stats = torch.randn(*shape[:-1], 1, device="cuda"), torch.randn(*shape[:-1], 1, device="cuda")
        yield f"layer norm weight grads {shape}", layer_norm_weight_grads, (g, x, *stats)
    for shape in ((4096, 768), (4096, 3072), (16384, 1024), (65536, 1024), (4096, 16384)):
        for dtype in (torch.float32, torch.bfloat16):
            yield f"sum(0) {shape} {str(dtype)[6:]}", column_sum, (torch.randn(*shape, device="cuda", dtype=dtype),)


def main() -> None:
    cache = pathlib.Path(tempfile.mkdtemp())
    print("| case | kernels | Inductor us | kiln (heuristics) us | " + " | ".join(name for name, _ in VARIANTS) + " |")
    print("|---" * (4 + len(VARIANTS)) + "|")
    for name, fn, args in cases():
        torch._dynamo.reset()
        inductor = torch.compile(fn, backend="inductor")
        inductor(*args)
        cells = [f"{1e6 * bench(functools.partial(inductor, *args)):.1f}"]
        graph = kernel_graph(fn, args)
        for options in ({}, *(options for _, options in VARIANTS)):
            cells.append(f"{microseconds(graph, args, TritonOptions(cache_dir=cache, compile_threads=0, **options)):.1f}")
        print(f"| {name} | {len(graph.kernels)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
