"""GPU: long cumsum (loopir split scans on / off) and scatter_reduce's compare-and-swap paths,
eager / Inductor / kiln, CUDA-event medians (issue 20; BENCHMARKS.md session 9).

    python tools/bench_scans.py [cumsum|scatter]   # a name prefix selects workloads
"""

from __future__ import annotations

import statistics
import sys

import torch

from kiln.integration import backend
from kiln.loopir._internal import lower_scan


def bench(fn, *args, n: int = 50) -> float:
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn(*args)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / n)
    return statistics.median(times)


def kiln(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options={"fallback": False}))


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
