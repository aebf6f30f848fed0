"""GPU: long cumsum (loopir split scans on / off) and scatter_reduce's compare-and-swap paths,
eager / Inductor / kiln, median GPU milliseconds per call (triton's do_bench) (issue 20; BENCHMARKS.md session 9).

    python tools/bench_scans.py [cumsum|scatter]   # a name prefix selects workloads
"""

from __future__ import annotations

import sys

import torch
from bench_gpu_rows import bench as gpu_seconds  # tools/ is this script's directory
from workloads import CountingBackend

from kiln.integration import backend
from kiln.loopir._internal import lower_scan


def bench(fn, *args) -> float:
    """Median milliseconds per call (triton's do_bench, as bench_gpu_rows.py times its rows)."""
    return gpu_seconds(lambda: fn(*args)) * 1e3


def kiln(fn):
    torch._dynamo.reset()
    counting = CountingBackend(lambda gm, ex: backend(gm, ex, options={"fallback": False}))
    compiled = torch.compile(fn, backend=counting)

    def run(*args):
        result = compiled(*args)
        if counting.calls == 0:
            raise RuntimeError("Dynamo never called kiln")
        return result
    return run


def inductor(fn):
    torch._dynamo.reset()
    return torch.compile(fn)


def workloads() -> dict:
    cuda = {"device": "cuda"}
    cases = {
        "cumsum 2^26 fp32 (1 row)": (lambda x: torch.cumsum(x, 0), (torch.randn(1 << 26, **cuda),)),
        "cumsum 4x2^24 fp32 dim -1": (lambda x: torch.cumsum(x, -1), (torch.randn(4, 1 << 24, **cuda),)),
        "cumsum 2^24 bf16 (1 row)": (lambda x: torch.cumsum(x, 0),
                                     (torch.randn(1 << 24, dtype=torch.bfloat16, **cuda),)),
    }
    index, source, base = (torch.randint(0, 4096, (1 << 22,), **cuda), torch.randn(1 << 22, **cuda),
                           torch.randn(4096, **cuda))
    for mode in ("amax", "prod", "sum", "mean"):
        cases[f"scatter_reduce {mode} 2^22 -> 4096 fp32"] = (
            (lambda m: lambda b, i, s: b.scatter_reduce(0, i, s, m))(mode), (base, index, source))
    return cases


def main() -> None:
    print("| workload | eager ms | Inductor ms | kiln ms | kiln, no split scans ms | max |kiln - eager| |")
    print("|---|---|---|---|---|---|")
    for name, (fn, args) in workloads().items():
        if sys.argv[1:] and not name.startswith(sys.argv[1]):
            continue
        want = fn(*args)
        eager_ms, inductor_ms = bench(fn, *args), bench(inductor(fn), *args)
        compiled = kiln(fn)
        got = compiled(*args)
        kiln_ms = bench(compiled, *args)
        unsplit = "-"
        if name.startswith("cumsum"):
            saved, lower_scan.SPLIT_SCAN_TYPES = lower_scan.SPLIT_SCAN_TYPES, ()
            unsplit = f"{bench(kiln(fn), *args):.3f}"
            lower_scan.SPLIT_SCAN_TYPES = saved
        err = float((got.double() - want.double()).abs().max())
        print(f"| {name} | {eager_ms:.3f} | {inductor_ms:.3f} | {kiln_ms:.3f} | {unsplit} | "
              f"{err:.3g} (of {float(want.double().abs().max()):.3g}) |", flush=True)


if __name__ == "__main__":
    main()
