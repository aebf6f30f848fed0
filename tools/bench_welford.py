"""One-pass (Welford) against two-pass variance on the GPU: var_mean and layer norm rows (issues 13/14).

    PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\n' ':')$PWD/integration/src \
        python tools/bench_welford.py [--widths 1024 4096 16384] [--dtypes float32 bfloat16] [--graphs] [--out welford.md]

Run from the repository root, its sources first on PYTHONPATH as above. For every workload
(var_mean and layer norm over the last dim, group norm statistics), row width and dtype, in one
run: eager, Inductor, kiln with codegen_triton's `welford` capability on (off by default until checked on a GPU: a variance's
sum and m2 in one loop, each element read once) and kiln with that capability turned off (two
passes, the row read twice). The two-pass kiln runs in a subprocess that turns the capability off
before anything compiles, with kiln's whole-graph cache off, so neither reuses the other's kernels.
Each time is the median of `triton.testing.do_bench` (L2 flushed); `--graphs` times CUDA graph
replays (GPU time only). Columns: % of the measured device-to-device copy bandwidth (bytes the
workload must move over its time), one-pass/two-pass and one-pass/Inductor speedups, the max error
of one-pass kiln against eager, and whether its generated source has the Welford fold.
"""

from __future__ import annotations

import dataclasses
import json
import os

import torch
from bench_gpu_rows import (
    DTYPES,
    Table,
    copy_bandwidth,
    eager_and_inductor,
    kiln_or_nan,
    percent_of_copy,
    row_arguments,
    worker_results,
)
from workloads import layer_norm_rows, var_mean_rows


def group_norm_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.group_norm(x.view(x.shape[0] // 8, 8, -1), 4)


def cases(width: int, dtype: torch.dtype, elements: int):
    """(name, fn, args) of every workload at one width and dtype, on the GPU."""
    rows = max(8, elements // width // 8 * 8)  # group_norm_rows views 8 rows as channels
    x = torch.randn(rows, width, device="cuda", dtype=dtype) * 2 + 3
    w, b = torch.randn(width, device="cuda", dtype=dtype), torch.randn(width, device="cuda", dtype=dtype)
    return [("var_mean", var_mean_rows, (x,)), ("layer_norm", layer_norm_rows, (x, w, b)),
            ("group_norm", group_norm_rows, (x,))]


def set_welford(on: bool) -> None:
    """codegen_triton with or without the `welford` capability (off by default until it has been
    checked on a GPU), before the backend first loads it."""
    import kiln.codegen_triton as codegen_triton
    plugin = codegen_triton.CODEGEN
    codegen_triton.CODEGEN = dataclasses.replace(
        plugin, capabilities=dataclasses.replace(plugin.capabilities, welford=on))


def worker(width: int, dtype_name: str, elements: int) -> None:
    """kiln two-pass times, printed as one RESULT line (run by `two_pass_times`)."""
    set_welford(False)
    results = {}
    for name, fn, args in cases(width, DTYPES[dtype_name], elements):
        results[name], _ = kiln_or_nan(fn, args, fn(*args), f"{name} {width} {dtype_name}, two passes")
    print("RESULT " + json.dumps(results))


def two_pass_times(width: int, dtype_name: str, elements: int) -> dict[str, float]:
    return worker_results(__file__, [str(width), dtype_name, str(elements)], {**os.environ, "KILN_GRAPH_CACHE": "0"})


def has_welford_fold(fn, args) -> bool:
    from kiln.integration import explain
    torch._dynamo.reset()
    return "kiln_device.welford_combine" in explain(fn, *args, options={"fallback": False}).source


def measure_row(name, fn, args, width, dtype_name, bandwidth, two_pass) -> str:
    want = fn(*args)
    nbytes, eager, inductor = eager_and_inductor(fn, args)
    where = f"{name} {width} {dtype_name}"
    one_pass, error = kiln_or_nan(fn, args, want, where)
    folded = one_pass == one_pass and has_welford_fold(fn, args)
    pct = percent_of_copy(nbytes, bandwidth)
    row = [name, str(width), dtype_name, pct(eager), pct(inductor), pct(one_pass), pct(two_pass),
           f"{two_pass / one_pass:.2f}x", f"{inductor / one_pass:.2f}x", f"{error:.1e}", "yes" if folded else "NO"]
    return "| " + " | ".join(row) + " |"


def main() -> None:
    args = row_arguments(__doc__).parse_args()
    if args.worker:
        worker(int(args.worker[0]), args.worker[1], int(args.worker[2]))
        return
    set_welford(True)
    if args.graphs:  # read by bench(), here and in the workers
        os.environ["BENCH_GRAPHS"] = "1"
    bandwidths = {name: copy_bandwidth(DTYPES[name]) for name in args.dtypes}
    head = ["workload", "width", "dtype", "eager %", "Inductor %", "kiln one-pass %", "kiln two-pass %",
            "one/two-pass", "kiln/Inductor", "kiln err", "Welford fold"]
    table = Table(head, bandwidths, args.graphs, args.out)
    for dtype_name in args.dtypes:
        for width in args.widths:
            two_pass = two_pass_times(width, dtype_name, args.elements)
            for name, fn, fargs in cases(width, DTYPES[dtype_name], args.elements):
                table.add(measure_row(name, fn, fargs, width, dtype_name, bandwidths[dtype_name],
                                      two_pass.get(name, float("nan"))))

if __name__ == "__main__":
    main()
