"""Strided (column) reductions through kiln's GPU lowering, timed with a few strided block
options against Inductor (session 21, BENCHMARKS.md: why codegen_triton's strided reductions
take 32 x 16 tiles, and 64 x 16 for long chunks of 2-byte values).

    PYTHONPATH=<packages/*/src>:integration/src:tools python tools/strided_reduction_probe.py   # on a GPU
    ... strided_reduction_probe.py --wide-targets 1024 4096   # loopir's WIDE_STRIDED_TARGET_PROGRAMS instead

Cases: a layer norm backward's weight and bias gradients (`(g * (x - mean) * rstd).sum(rows)`
and `g.sum(rows)`, float32, the training step's class of short 128-row chunks) and sums over
dim 0 at several shapes in float32 and bfloat16. Each cell is microseconds of a CUDA graph
replay (`bench_gpu_rows.bench`) of the whole compiled graph (both split stages); a variant's
options override the codegen's heuristics for every strided kernel. With `--wide-targets`, the
columns are instead the heuristics under each value of loopir's `WIDE_STRIDED_TARGET_PROGRAMS`
(the programs a split over outer dims of 4-byte values aims at; session 22 chose 4096 this way),
over more layer-norm-gradient and column-sum shapes.
"""

from __future__ import annotations

import argparse
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


def cases(more: bool = False):
    for shape in ((8, 512, 768), (32, 512, 768), (4096, 3072)) + (((16, 512, 1024), (8, 2048, 768)) if more else ()):
        g, x = torch.randn(*shape, device="cuda"), torch.randn(*shape, device="cuda")
        stats = torch.randn(*shape[:-1], 1, device="cuda"), torch.randn(*shape[:-1], 1, device="cuda")
        yield f"layer norm weight grads {shape}", layer_norm_weight_grads, (g, x, *stats)
    for shape in ((4096, 768), (4096, 3072), (16384, 1024), (65536, 1024), (4096, 16384)) + (
            ((16384, 3072), (8192, 768), (32768, 4096)) if more else ()):
        for dtype in (torch.float32, torch.bfloat16):
            yield f"sum(0) {shape} {str(dtype)[6:]}", column_sum, (torch.randn(*shape, device="cuda", dtype=dtype),)


def wide_targets(targets: list[int]) -> None:
    """The heuristics' time under each `WIDE_STRIDED_TARGET_PROGRAMS` (loopir's split lowering)."""
    from kiln.loopir._internal import lower_split

    cache, default = pathlib.Path(tempfile.mkdtemp()), lower_split.WIDE_STRIDED_TARGET_PROGRAMS
    print("| case | Inductor us | " + " | ".join(f"kiln, {t} programs us" for t in targets) + " |")
    print("|---" * (2 + len(targets)) + "|")
    for name, fn, args in cases(more=True):
        torch._dynamo.reset()
        inductor = torch.compile(fn, backend="inductor")
        inductor(*args)
        cells = [f"{1e6 * bench(functools.partial(inductor, *args)):.1f}"]
        for target in targets:
            lower_split.WIDE_STRIDED_TARGET_PROGRAMS = target
            try:
                graph = kernel_graph(fn, args)
                cells.append(f"{microseconds(graph, args, TritonOptions(cache_dir=cache, compile_threads=0)):.1f}")
            finally:
                lower_split.WIDE_STRIDED_TARGET_PROGRAMS = default
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wide-targets", nargs="+", type=int, metavar="PROGRAMS")
    options = parser.parse_args()
    if options.wide_targets:
        wide_targets(options.wide_targets)
        return
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
