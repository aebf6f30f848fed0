"""Page faults and median times per call of eager, Inductor and kiln called in turns, in a chosen order.

    python tools/output_faults.py --rows 4096 --width 1024 --orders eik eki [--workload rmsnorm]

Why: a large output freshly allocated may fault in every page (glibc grows, then trims, its heap
around it), and whether it does depends on what the calls before it allocated and freed, so a
benchmark that calls eager, Inductor and kiln in turns can charge one of them 4 KiB faults the
others escape. Each order is a fresh process; `--pool-mb 0` runs kiln without its output pool
(`KILN_CPU_OUTPUT_POOL_MB`, packages/codegen_cpp/.../output_pool.py).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def worker(order: str, rows: int, width: int, workload: str, repeat: int) -> str:
    import torch
    from workloads import layer_norm_rows, rmsnorm_rows

    x, w, b = torch.randn(rows, width), torch.randn(width), torch.randn(width)
    fn, args = {"rmsnorm": (rmsnorm_rows, (x, w)), "layer_norm": (layer_norm_rows, (x, w, b))}[workload]
    compiled = {"e": fn, "i": torch.compile(fn, backend="inductor"), "k": torch.compile(fn, backend="kiln")}
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # noqa: E731
    with torch.no_grad():
        for _ in range(3):
            for name in order:
                compiled[name](*args)
        times = {name: [] for name in order}
        counts = dict.fromkeys(order, 0)
        for _ in range(repeat):
            for name in order:
                before, start = faults(), time.perf_counter()
                compiled[name](*args)
                times[name].append(time.perf_counter() - start)
                counts[name] += faults() - before
    label = {"e": "eager", "i": "inductor", "k": "kiln"}
    return f"| {workload} {rows}x{width} | {order} | " + " | ".join(
        f"{label[n]} {statistics.median(times[n]) * 1e3:.3f} ms, {counts[n] / repeat:.0f} faults" for n in order) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--workload", default="rmsnorm", choices=["rmsnorm", "layer_norm"])
    parser.add_argument("--orders", nargs="+", default=["eik", "eki"])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--pool-mb", help="KILN_CPU_OUTPUT_POOL_MB for the workers (0: no pool)")
    parser.add_argument("--worker", nargs=1, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        print(worker(options.worker[0], options.rows, options.width, options.workload, options.repeat))
        return 0
    env = dict(os.environ)
    if options.pool_mb is not None:
        env["KILN_CPU_OUTPUT_POOL_MB"] = options.pool_mb
    print("| workload | order | per call (median, minor page faults) |\n|---|---|---|")
    for order in options.orders:
        result = subprocess.run([sys.executable, __file__, "--worker", order, "--rows", str(options.rows),
                                 "--width", str(options.width), "--workload", options.workload,
                                 "--repeat", str(options.repeat)], env=env, capture_output=True, text=True)
        lines = [line for line in result.stdout.splitlines() if line.startswith("|")]
        print(lines[-1] if lines else f"| {order} | failed: {result.stderr.strip().splitlines()[-1:]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
