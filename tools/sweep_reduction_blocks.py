"""Sweep codegen_triton's contiguous-reduction launch heuristics on a GPU (issue 14).

    PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\n' ':')$PWD/integration/src \
        python tools/sweep_reduction_blocks.py [sum var_mean softmax rmsnorm layer_norm] [--out sweep.json]

For each workload (rows of 2^26 elements in all), dtype (bfloat16, float32) and row width (1024,
4096, 16384), the kernel graph kiln's backend would build for a GPU is compiled with every RBLOCK
cap (1024 to 16384, at most the row) and every tile size per warp (512 B to 4 KiB, so the warps
vary), and each launch configuration is timed as bench_gpu_rows.py --graphs times (a CUDA graph
replay, L2 flushed between calls, median). Prints, per row, the heuristics' own choice and the
fastest configuration as % of the measured copy bandwidth; `--out` writes every time
(microseconds) as JSON. This is
how `_HELD_ROW_BYTES_PER_WARP` in codegen_triton's runtime.py was chosen (BENCHMARKS.md).
`--welford` sweeps the one-pass variance's kernels instead (loopir's welford rewrite, whatever the
plugin declares): every `welford_rblock` cap and tile elements per warp, beside the two-pass
heuristic (how session 18 found the one-pass form slower in every row).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pathlib
import tempfile

import torch
from bench_gpu_rows import bench, copy_bandwidth
from torch.fx.experimental.proxy_tensor import make_fx
from workloads import group_norm_rows, layer_norm_rows, rmsnorm_rows, softmax_rows, var_mean_rows

from kiln.codegen_triton import TritonOptions, compile
from kiln.codegen_triton._internal import runtime
from kiln.decomp import loop_level
from kiln.loopir import lower

WORKLOADS = {"sum": lambda x: x.sum(-1), "var_mean": var_mean_rows, "softmax": softmax_rows,
             "rmsnorm": rmsnorm_rows, "layer_norm": layer_norm_rows, "group_norm": group_norm_rows}
ELEMENTS = 1 << 26
DEFAULTS = (runtime._TILE_BYTES_PER_WARP, runtime._HELD_ROW_BYTES_PER_WARP,
            runtime._WELFORD_ELEMENTS_PER_WARP)  # restored after each timing


def kernel_graph(fn, args, welford: bool = False):
    """The lowering kiln's backend runs for a GPU (codegen_triton's capabilities; `welford`:
    a variance in one pass, whatever the plugin declares)."""
    gm = make_fx(fn, decomposition_table=loop_level(bias_epilogues=True))(*args)
    return lower(gm, row_temporaries=True, recompute_cheap=True, split_reductions=True, welford=welford)


def microseconds(graph, args, options: TritonOptions, per_warp: int | None = None) -> float:
    """Median microseconds of the compiled graph; with `per_warp`, every reduction kernel takes
    that tile size per warp instead of the heuristics' own (bytes; a Welford kernel's: elements)."""
    if per_warp is not None:
        runtime._TILE_BYTES_PER_WARP = runtime._HELD_ROW_BYTES_PER_WARP = per_warp
        runtime._WELFORD_ELEMENTS_PER_WARP = per_warp
    try:
        module = compile(graph, options)
        module(*args)
        return 1e6 * bench(lambda: module(*args))
    finally:
        runtime._TILE_BYTES_PER_WARP, runtime._HELD_ROW_BYTES_PER_WARP, runtime._WELFORD_ELEMENTS_PER_WARP = DEFAULTS


def sweep_row(name: str, dtype: torch.dtype, width: int, cache: pathlib.Path,
              rblocks=(1024, 2048, 4096, 8192, 16384), per_warps=(512, 1024, 2048, 4096), welford: bool = False) -> dict:
    """One row's timings; with `welford`, of the one-pass variance's kernels (RBLOCK caps are
    `welford_rblock`, tiles per warp in elements), the heuristic's two-pass time beside them."""
    x = torch.randn(ELEMENTS // width, width, device="cuda", dtype=dtype)
    w, b = torch.randn(width, device="cuda", dtype=dtype), torch.randn(width, device="cuda", dtype=dtype)
    wc, bc = w[:8].contiguous(), b[:8].contiguous()  # group_norm_rows views 8 rows as channels
    args = {"layer_norm": (x, w, b), "rmsnorm": (x, w), "group_norm": (x, wc, bc)}.get(name, (x,))
    graph = kernel_graph(WORKLOADS[name], args)
    heuristic = microseconds(graph, args, TritonOptions(cache_dir=cache, compile_threads=0))
    swept = kernel_graph(WORKLOADS[name], args, welford=True) if welford else graph
    times = {} if not welford else {"one pass, heuristic": round(microseconds(swept, args, TritonOptions(
        cache_dir=cache, compile_threads=0)), 2)}
    unit = "elements" if welford else "B"
    for rblock, per_warp in itertools.product(rblocks, per_warps):
        if rblock <= width:
            blocks = ({"welford_rblock": rblock} if welford else
                      {"contiguous_rblock": rblock, "float32_contiguous_rblock": rblock})
            options = TritonOptions(cache_dir=cache, compile_threads=0, **blocks)
            times[f"RBLOCK {rblock}, {per_warp} {unit}/warp"] = round(microseconds(swept, args, options, per_warp), 2)
    best = min(times, key=times.get)
    outputs = WORKLOADS[name](*args)
    moved = sum(t.numel() * t.element_size() for t in (*args, *(outputs if isinstance(outputs, tuple) else (outputs,))))
    return {"bytes": moved, "workload": name, "dtype": str(dtype).removeprefix("torch."), "width": width,
            "heuristic_us": round(heuristic, 2), "best": best, "best_us": times[best], "times_us": times}



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--out")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32", "float16"])
    parser.add_argument("--widths", nargs="+", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--rblocks", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384],
                        help="RBLOCK caps to try (those above the row are skipped)")
    parser.add_argument("--per-warp", nargs="+", type=int, default=[512, 1024, 2048, 4096],
                        help="bytes of tile per warp to try")
    parser.add_argument("--welford", action="store_true",
                        help="sweep the one-pass variance's kernels (welford_rblock, elements per warp) against "
                             "the two-pass heuristic")
    parser.add_argument("--held-max-warps", type=int, default=runtime._HELD_ROW_MAX_WARPS,
                        help="most warps of a kernel holding whole rows (runtime._HELD_ROW_MAX_WARPS)")
    args = parser.parse_args()
    runtime._HELD_ROW_MAX_WARPS = args.held_max_warps
    dtypes = [getattr(torch, d) for d in args.dtypes]
    os.environ["BENCH_GRAPHS"] = "1"
    cache, rows = pathlib.Path(tempfile.mkdtemp()), []
    bandwidth = {dtype: copy_bandwidth(dtype) for dtype in dtypes}
    for name in args.workloads:
        for dtype, width in itertools.product(dtypes, args.widths):
            row = sweep_row(name, dtype, width, cache, args.rblocks, args.per_warp, args.welford)
            rows.append(row)
            percent = {key: 100 * row["bytes"] / (us * 1e-6) / bandwidth[dtype]
                       for key, us in (("heuristic_us", row["heuristic_us"]), ("best_us", row["best_us"]),
                                       *row["times_us"].items())}
            print(f"{name} {row['dtype']} {width}: heuristic {row['heuristic_us']} us ({percent['heuristic_us']:.1f}% of "
                  f"copy), best {row['best']} {row['best_us']} us ({percent['best_us']:.1f}%)", flush=True)
            if args.welford:
                print("    " + "; ".join(f"{key} {percent[key]:.1f}" for key in row["times_us"]), flush=True)
            if args.out:
                pathlib.Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
