"""A hand-written Triton row sum over bfloat16 rows, with and without an L2 eviction hint, `tl.range`
and num_stages (session 13, BENCHMARKS.md: why codegen_triton marks a reduction kernel's only read
of a row `evict_first`).

    PYTHONPATH=tools python tools/eviction_probe.py   # on a GPU; prints GB/s per variant
"""

from __future__ import annotations

import functools
import itertools
import os

import torch
import triton
import triton.language as tl
from bench_gpu_rows import bench


@triton.jit
def row_sum(x_ptr, out_ptr, RNUMEL: tl.constexpr, RBLOCK: tl.constexpr, EVICT: tl.constexpr, TL_RANGE: tl.constexpr):
    row = tl.program_id(0)
    rbase = tl.arange(0, RBLOCK)[None, :]
    acc = tl.full([1, RBLOCK], 0, tl.float32)
    if TL_RANGE:
        for roffset in tl.range(0, RNUMEL, RBLOCK):
            rindex = roffset + rbase
            if EVICT:
                v = tl.load(x_ptr + row * RNUMEL + rindex, rindex < RNUMEL, eviction_policy="evict_first", other=0.0)
            else:
                v = tl.load(x_ptr + row * RNUMEL + rindex, rindex < RNUMEL, other=0.0)
            acc = acc + v.to(tl.float32)
    else:  # as codegen_triton writes its loops
        for roffset in range(0, RNUMEL, RBLOCK):
            rindex = roffset + rbase
            rmask = rindex < RNUMEL
            if EVICT:
                v = tl.load(x_ptr + row * RNUMEL + rindex, rmask, eviction_policy="evict_first")
            else:
                v = tl.load(x_ptr + row * RNUMEL + rindex, rmask)
            acc = acc + tl.where(rmask, v.to(tl.float32), 0)
    tl.store(out_ptr + row + tl.arange(0, 1)[:, None], tl.sum(acc, 1)[:, None].to(out_ptr.dtype.element_ty))


def launch(x: torch.Tensor, out: torch.Tensor, rblock: int, evict: int, tl_range: int, options: dict) -> None:
    row_sum[(x.shape[0],)](x, out, x.shape[1], rblock, evict, tl_range, **options)


def main() -> None:
    os.environ["BENCH_GRAPHS"] = "1"
    variants = [(0, 0, None), (1, 0, None), (0, 1, 1), (1, 1, 1), (1, 1, 2)]  # evict, tl.range, num_stages
    for width in (1024, 16384):
        x = torch.randn((1 << 26) // width, width, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(x.shape[0], device="cuda", dtype=torch.bfloat16)
        rblocks = sorted({min(width, r) for r in (1024, 2048, 8192)})
        for rblock, warps, (evict, tl_range, stages) in itertools.product(rblocks, (4, 8, 16), variants):
            options = {"num_warps": warps, **({"num_stages": stages} if stages else {})}
            call = functools.partial(launch, x, out, rblock, evict, tl_range, options)
            call()
            seconds = bench(call)
            print(f"width {width} RBLOCK {rblock} warps {warps} evict_first {evict} tl.range {tl_range} "
                  f"stages {stages}: {x.numel() * 2 / seconds / 1e9:.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
