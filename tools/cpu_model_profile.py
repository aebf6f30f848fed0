"""The CPU bench's HF models, kiln against Inductor in one process: interleaved timing, the
matmul calls each makes, and self time per category under torch.profiler.

    OMP_WAIT_POLICY=passive python tools/cpu_model_profile.py [bert gpt2 llama] [--rounds 15]

For each model (`workloads.model_workloads("cpu")`): the median wall time per call of each
compiler over `--rounds` alternating rounds and the median per-round kiln/Inductor ratio; then
self CPU time per call by category (matmuls, attention, kiln's kernels, the compiled region's own
time) over alternating profiled calls, and each compiler's matmul calls by input sizes (the
profiler's shapes: a TorchDispatchMode would not do, Dynamo runs compiled code eagerly under one).
`--kernels` also lists each generated kernel's self time per call, Inductor's included
(`torch._inductor.config.cpp.enable_kernel_profile` names its C++ kernels under the profiler).
"""

from __future__ import annotations

import argparse
import collections
import functools
import statistics
import tempfile
import time

import torch
from workloads import model_workloads

from kiln.integration import backend as kiln_backend


def category(key: str) -> str:
    if key.startswith("kiln::"):
        return "kiln kernels"
    if key.startswith("graph_") or "cpp_fused" in key:  # Inductor's, named with --kernels
        return "Inductor kernels"
    if "Compiled" in key:
        return "compiled region / graph self"
    if key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::copy_") or "attention" in key:
        return key
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=["bert", "gpt2", "llama"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--kernels", action="store_true", help="each generated kernel's self time per call")
    args = parser.parse_args()
    if args.kernels:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True
    for name, model, inputs in model_workloads("cpu"):
        if name.split()[0] not in args.models:
            continue
        compiled = {}
        for label in ("inductor", "kiln"):
            torch._dynamo.reset()
            backend = "inductor" if label == "inductor" else functools.partial(
                kiln_backend, options={"fallback": False, "cache_dir": tempfile.mkdtemp()})
            compiled[label] = torch.compile(model, backend=backend)
            with torch.no_grad():
                for _ in range(5):
                    compiled[label](*inputs)
        times = {label: [] for label in compiled}
        with torch.no_grad():
            for _ in range(args.rounds):
                for label, fn in compiled.items():
                    start = time.perf_counter()
                    fn(*inputs)
                    times[label].append(time.perf_counter() - start)
            ratio = statistics.median(i / k for i, k in zip(times["inductor"], times["kiln"]))
            print(f"{name}: " + ", ".join(f"{label} {1e3 * statistics.median(t):.2f} ms" for label, t in times.items())
                  + f"; kiln/Inductor speed per round {ratio:.3f}x")
            totals = {label: collections.Counter() for label in compiled}
            shapes = {}
            kernels = {label: collections.Counter() for label in compiled}
            for _ in range(6):
                for label, fn in compiled.items():
                    with torch.profiler.profile(record_shapes=True) as prof:
                        for _ in range(3):
                            fn(*inputs)
                    for event in prof.key_averages():
                        totals[label][category(event.key)] += event.self_cpu_time_total / 18 / 1e3
                        if event.key.startswith(("kiln::", "graph_")) or "cpp_fused" in event.key:
                            kernels[label][event.key] += event.self_cpu_time_total / 18
                    shapes[label] = sorted(f"{e.count // 3} x {e.key}{e.input_shapes}"
                                           for e in prof.key_averages(group_by_input_shape=True)
                                           if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))
            for label, total in totals.items():
                print(f"  {label} self ms per call: " + ", ".join(f"{k} {v:.2f}" for k, v in total.most_common()))
                print(f"  {label} matmuls per call: " + "; ".join(shapes[label]))
                if args.kernels:
                    print(f"  {label} kernels, us per call ({sum(kernels[label].values()):.0f} in all): "
                          + "; ".join(f"{k} {v:.0f}" for k, v in kernels[label].most_common()))


if __name__ == "__main__":
    main()
