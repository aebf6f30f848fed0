"""A hand-written Triton sum over dim 0 in kiln's loop form, timed at several XBLOCK x RBLOCK tiles
and warp counts (session 17, BENCHMARKS.md: why codegen_triton's strided reductions take 64 x 8
tiles with a warp per 256 bytes).

    PYTHONPATH=tools python tools/strided_tile_probe.py [--dtypes bfloat16 float32] [--shapes 768:4096:32]

`--shapes WIDTH:ROWS:CHUNKS` adds shapes besides the 2^26-element ones: the short chunks of
training's weight and bias gradients (4096 rows of 768 in 32 chunks of 128 rows; session 21).

Each row is one width with the split count loopir picks for it (chunks of rows summed by the
first stage, whose outputs this probe stores); each cell is % of copy bandwidth of a CUDA graph
replay (`bench_gpu_rows.bench`).
"""

from __future__ import annotations

import argparse
import functools
import os

import torch
import triton
import triton.language as tl

os.environ.setdefault("BENCH_GRAPHS", "1")
from bench_gpu_rows import DTYPES, bench, copy_bandwidth  # noqa: E402

# (width, rows, chunks): loopir's split of 2^26 elements at these widths
SHAPES = tuple((width, (1 << 26) // width, chunks) for width, chunks in
               ((512, 64), (1024, 32), (2048, 16), (4096, 8), (16384, 2)))
TILES = ((32, 64, 8), (32, 16, 4), (32, 16, 8), (64, 8, 4), (64, 8, 8), (64, 16, 4), (64, 16, 8), (64, 32, 8),
         (128, 8, 8), (32, 8, 4))


@triton.jit
def first_stage(inp, out, W: tl.constexpr, ROWS: tl.constexpr, XNUMEL: tl.constexpr, XBLOCK: tl.constexpr,
                RBLOCK: tl.constexpr):
    """Column sums of `ROWS`-row chunks, as kiln writes the loop (masked load, masked value)."""
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < XNUMEL
    rbase = tl.arange(0, RBLOCK)[None, :]
    chunk = xindex // W
    column = xindex % W
    acc = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    for roffset in range(0, ROWS, RBLOCK):
        rindex = roffset + rbase
        rmask = rindex < ROWS
        value = tl.load(inp + (ROWS * W * chunk + column + W * rindex), xmask & rmask, eviction_policy="evict_first")
        acc = acc + tl.where(xmask & rmask, value.to(tl.float32), 0)
    tl.store(out + xindex, tl.sum(acc, 1)[:, None], xmask)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=list(DTYPES))
    parser.add_argument("--shapes", nargs="*", default=[], metavar="WIDTH:ROWS:CHUNKS")
    args = parser.parse_args()
    shapes = SHAPES + tuple(tuple(int(v) for v in shape.split(":")) for shape in args.shapes)
    for name in args.dtypes:
        dtype = DTYPES[name]
        bandwidth = copy_bandwidth(dtype)
        print(f"| {name} width x rows, chunks | " + " | ".join(f"{x}x{r} w{w}" for x, r, w in TILES) + " |")
        for width, rows, chunks in shapes:
            x = torch.randn(rows, width, device="cuda", dtype=dtype)
            y = torch.empty(chunks * width, device="cuda", dtype=torch.float32)
            cells = []
            for xblock, rblock, warps in TILES:
                launch = first_stage[(chunks * width // xblock,)]
                seconds = bench(functools.partial(launch, x, y, W=width, ROWS=rows // chunks, XNUMEL=chunks * width,
                                                  XBLOCK=xblock, RBLOCK=rblock, num_warps=warps))
                cells.append(f"{100 * x.numel() * x.element_size() / seconds / bandwidth:.1f}")
            print(f"| {width} x {rows}, {chunks} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
