"""Host (Python) time per call of a compiled graph: kiln against Inductor on launch-bound work.

    python tools/host_overhead.py [--model bert] [--profile 40] [--out results.md]
    python tools/host_overhead.py --model convnet --backends inductor kiln --breakdown

Builds the bfloat16 inference workloads of `tools/bench_low_precision.py` (HF models, 6 layers,
d768, 8x512) plus a launch-bound chain of small pointwise/reduction ops, compiles each with
Inductor and kiln, each in the default mode and with mode="reduce-overhead" (CUDA graphs), and
reports per call: the host time to
enqueue it (the GPU is never waited for inside the timed loop), the wall time with a sync, and
the host microseconds per launched GPU kernel. `--model convnet` adds the float32 channels-last
batch norm blocks in train mode of `workloads.channels_last_workloads` (under no_grad: the running
statistics are written on every call). `--profile N` then prints kiln's N costliest
Python functions (cProfile, by own time) over 50 calls of the first workload.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch
from workloads import CountingBackend, channels_last_workloads, model_workloads

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
    if "convnet" in names:  # batch norm in train mode: running statistics written per call
        result += [w for w in channels_last_workloads("cuda") if "train" in w[0]]
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
    parser.add_argument("--backends", nargs="+", default=[" ".join(b for b in pair if b) for pair in BACKENDS],
                        help='of "inductor", "kiln", "inductor reduce-overhead", "kiln reduce-overhead"')
    parser.add_argument("--breakdown", action="store_true",
                        help="after each kiln default-mode run: host time inside kernels, launches, externs")
    parser.add_argument("--rounds", type=int, default=0,
                        help="then time Inductor and kiln (default mode) alternately this many times: "
                             "medians and kiln/Inductor per round, robust to a host whose speed drifts")
    parser.add_argument("--out")
    args = parser.parse_args()
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}",
             "", "| workload | backend | host ms/call | wall ms/call | GPU kernels/call | host us/kernel |",
             "|---|---|---|---|---|---|"]
    profiled = False
    with torch.no_grad():
        for name, fn, fargs in workloads(args.model):
            for backend, mode in BACKENDS:
                if " ".join(b for b in (backend, mode) if b) not in args.backends:
                    continue
                run, counting = compiled(backend, mode, fn)
                host, wall = host_and_wall(run, fargs)
                if counting is not None and counting.calls == 0:
                    raise RuntimeError(f"{name}: Dynamo never called kiln")
                kernels = kernels_per_call(run, fargs)
                label = backend + (f" {mode}" if mode else "")
                lines.append(f"| {name} | {label} | {host * 1e3:.2f} | {wall * 1e3:.2f} | {kernels:.0f} | "
                             f"{host * 1e6 / max(kernels, 1):.1f} |")
                print(lines[-1], flush=True)
                if backend == "kiln" and not mode and args.breakdown:
                    lines += [f"| {name} | kiln breakdown | {row} |" for row in breakdown(run, fargs)]
                    print("\n".join(lines[-5:]), flush=True)
                if backend == "kiln" and not mode and args.profile and not profiled:
                    profiled = True  # now, before the next workload's dynamo reset recompiles it
                    print_profile(run, fargs, args.profile)
        if args.rounds:
            lines += interleaved(workloads(args.model), args.rounds)
        if args.out:
            with open(args.out, "w") as f:
                f.write("\n".join(lines) + "\n")


def _medians(samples: list[tuple[float, float]]) -> str:
    """'host / wall' milliseconds, each the median over rounds."""
    return " / ".join(f"{statistics.median(s[part] for s in samples) * 1e3:.2f}" for part in (0, 1))


def interleaved(cases, rounds: int) -> list[str]:
    """Inductor and kiln compiled side by side (no reset between), timed in turn `rounds` times."""
    lines = ["", "| workload | Inductor host / wall ms (medians) | kiln host / wall ms (medians) | "
             "kiln/Inductor wall per round |", "|---|---|---|---|"]
    for name, fn, fargs in cases:
        torch._dynamo.reset()
        inductor = torch.compile(fn)
        counting = CountingBackend(kiln_backend)
        kiln = torch.compile(fn, backend=counting)
        inductor(*fargs), kiln(*fargs)
        if counting.calls == 0:
            raise RuntimeError(f"{name}: Dynamo never called kiln")
        times = {"inductor": [], "kiln": []}
        for _ in range(rounds):
            for label, run in (("inductor", inductor), ("kiln", kiln)):
                times[label].append(host_and_wall(run, fargs, repeat=30))
        ratios = " ".join(f"{k[1] / i[1]:.2f}" for i, k in zip(times["inductor"], times["kiln"]))
        lines.append(f"| {name} | {_medians(times['inductor'])} | {_medians(times['kiln'])} | {ratios} |")
        print(lines[-1], flush=True)
    return lines


class _Timed:
    """Patches `owner.name` to add the time spent inside it (outermost calls only) to a total."""

    def __init__(self, owner, name: str):
        self.owner, self.name, self.original = owner, name, getattr(owner, name)
        self.seconds, self.calls, self._depth = 0.0, 0, 0

    def __enter__(self):
        original, timed = self.original, self

        def wrapper(*args, **kwargs):
            if timed._depth:
                return original(*args, **kwargs)
            timed._depth += 1
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timed.seconds += time.perf_counter() - start
                timed.calls += 1
                timed._depth -= 1
        setattr(self.owner, self.name, wrapper)
        return self

    def __exit__(self, *exc):
        setattr(self.owner, self.name, self.original)


def breakdown(run, fargs, repeat: int = 50) -> list[str]:
    """Host microseconds per call: in total, inside kiln's kernel objects, inside their launches,
    inside Triton's launcher, and inside ATen ops called by the wrapper (externs)."""
    from triton.backends.nvidia.driver import CudaLauncher

    from kiln.codegen_triton._internal.launch import DirectLauncher
    from kiln.codegen_triton._internal.runtime import TritonKernel
    for _ in range(5):
        run(*fargs)
    torch.cuda.synchronize()
    with (_Timed(TritonKernel, "__call__") as kernel, _Timed(DirectLauncher, "launch") as launch,
          _Timed(CudaLauncher, "__call__") as triton, _Timed(torch._ops.OpOverload, "__call__") as aten):
        start = time.perf_counter()
        for _ in range(repeat):
            run(*fargs)
        total = time.perf_counter() - start
    torch.cuda.synchronize()
    rows = [("total", total, repeat), ("TritonKernel.__call__", kernel.seconds, kernel.calls),
            ("DirectLauncher.launch", launch.seconds, launch.calls),
            ("Triton CudaLauncher", triton.seconds, triton.calls), ("ATen ops (externs)", aten.seconds, aten.calls)]
    return [f"{label}: {seconds * 1e6 / repeat:.0f} us/call, {calls / repeat:.0f} calls, "
            f"{seconds * 1e6 / max(calls, 1):.1f} us each" for label, seconds, calls in rows]


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
