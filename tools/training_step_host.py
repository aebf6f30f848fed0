"""Host and GPU time of a BERT 6L d768 8x512 training step: eager, Inductor and kiln in one process.

    python tools/training_step_host.py amp|fp32 [--rounds 15] [--cprofile 45]

The step of `tools/bench_low_precision.py --suite train` (`bert_training_steps`: forward, a
mean-square loss, backward; no optimizer), with autocast bf16 (`amp`) or in float32. Prints, per backend, the median host time to
enqueue a step and its wall time with a sync (interleaved rounds), the GPU time and kernel count per
step (torch.profiler), the top GPU kernels, kiln's output allocations per step and its costliest
Python functions (cProfile, own time). Run the two modes in separate processes: each compiles its own graphs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch
from bench_low_precision import bert_training_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["amp", "fp32"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cprofile", type=int, default=45, help="rows of kiln's cProfile (0: none)")
    args = parser.parse_args()
    steps = bert_training_steps(amp=args.mode == "amp")
    for step in steps.values():
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    host, wall = {k: [] for k in steps}, {k: [] for k in steps}
    for _ in range(args.rounds):
        for label, step in steps.items():
            start = time.perf_counter()
            step()
            host[label].append(1e3 * (time.perf_counter() - start))
            torch.cuda.synchronize()
            wall[label].append(1e3 * (time.perf_counter() - start))
    for label in steps:
        print(f"{args.mode} {label}: host {statistics.median(host[label]):.2f} ms, wall {statistics.median(wall[label]):.2f} ms")
    for label in ("inductor", "kiln"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                steps[label]()
            torch.cuda.synchronize()
        kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        print(f"{label}: GPU {sum(e.self_device_time_total for e in kernels) / 2e3:.3f} ms/step, "
              f"{sum(e.count for e in kernels) / 2:.0f} kernels/step")
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=60))
    if args.cprofile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(10):
            steps["kiln"]()
        torch.cuda.synchronize()
        profile.disable()
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        allocations = sum(calls for (_, _, name), (_, calls, *_) in stats.stats.items() if "empty_strided" in name)
        print(f"kiln: {allocations / 10:.0f} output allocations (empty_strided) per step")
        stats.sort_stats("tottime").print_stats(args.cprofile)
        print(text.getvalue())


if __name__ == "__main__":
    main()
