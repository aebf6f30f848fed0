"""Host (Python) time per call of a compiled graph: kiln against Inductor on launch-bound work.

    python tools/host_overhead.py [--model bert] [--profile 40] [--out results.md]

Builds the bfloat16 inference workloads of `tools/bench_low_precision.py` (HF models, 6 layers,
d768, 8x512) plus a launch-bound chain of small pointwise/reduction ops, compiles each with
Inductor and kiln, each in the default mode and with mode="reduce-overhead" (CUDA graphs), and
reports per call: the host time to
enqueue it (the GPU is never waited for inside the timed loop), the wall time with a sync, and
the host microseconds per launched GPU kernel. `--profile N` then prints kiln's N costliest
Python functions (cProfile, by own time) over 50 calls of the first workload.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch
from workloads import CountingBackend, model_workloads

from kiln.integration import backend as kiln_backend


def small_chain(x, w):
    """About 20 tiny kernels' worth of work: the host's cost per launch dominates."""
    for _ in range(10):
        x = torch.softmax(x * w + 1, -1)
        x = x - x.mean(-1, keepdim=True)
    return x


def workloads(names):
    result = []
    for name, model, (ids,) in model_workloads("cuda"):
        if name.split()[0] in names:
            result.append((name + " bf16", model.to(torch.bfloat16), (ids,)))
    x = torch.randn(64, 256, device="cuda")
    result.append(("launch-bound chain 64x256", small_chain, (x, torch.randn(256, device="cuda"))))
    return result


def kernels_per_call(fn, args) -> float:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA)


def host_and_wall(fn, args, repeat: int = 50) -> tuple[float, float]:
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    hosts, walls = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*args)
        hosts.append(time.perf_counter() - start)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
    return statistics.median(hosts), statistics.median(walls)


BACKENDS = (("inductor", None), ("kiln", None), ("inductor", "reduce-overhead"), ("kiln", "reduce-overhead"))


def compiled(backend: str, mode: str | None, fn):
    torch._dynamo.reset()
    if backend == "inductor":
        return torch.compile(fn, mode=mode), None
    counting = CountingBackend(lambda gm, ex: kiln_backend(gm, ex, mode=mode))
    return torch.compile(fn, backend=counting), counting


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", nargs="+", default=["bert", "llama"])
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--out")
    args = parser.parse_args()
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}",
             "", "| workload | backend | host ms/call | wall ms/call | GPU kernels/call | host us/kernel |",
             "|---|---|---|---|---|---|"]
    profiled = False
    with torch.no_grad():
        for name, fn, fargs in workloads(args.model):
            for backend, mode in BACKENDS:
                run, counting = compiled(backend, mode, fn)
                host, wall = host_and_wall(run, fargs)
                if counting is not None and counting.calls == 0:
                    raise RuntimeError(f"{name}: Dynamo never called kiln")
                kernels = kernels_per_call(run, fargs)
                label = backend + (f" {mode}" if mode else "")
                lines.append(f"| {name} | {label} | {host * 1e3:.2f} | {wall * 1e3:.2f} | {kernels:.0f} | "
                             f"{host * 1e6 / max(kernels, 1):.1f} |")
                print(lines[-1], flush=True)
                if backend == "kiln" and not mode and args.profile and not profiled:
                    profiled = True  # now, before the next workload's dynamo reset recompiles it
                    print_profile(run, fargs, args.profile)
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")


def print_profile(run, fargs, rows: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(50):
        run(*fargs)
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(rows)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(rows)


if __name__ == "__main__":
    main()
