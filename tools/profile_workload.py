"""Where a workload's time goes: torch.profiler tables for eager, Inductor and kiln.

    python tools/profile_workload.py --device cuda --workload bert [--rows 25] [--dtype bfloat16]

For each backend: the workload is compiled (kiln's call counted: a run where Dynamo never
called kiln is an error), warmed up, then profiled over `--steps` calls. Prints the top ops /
kernels by self device time (self CPU time on CPU) and the number of kernel launches per call.
"""

from __future__ import annotations

import argparse
import sys

import torch
from workloads import CountingBackend, model_workloads, synchronize, workloads

from kiln.integration import backend as kiln_backend


def _find(name: str, device: str):
    for label, fn, args in workloads(device) + model_workloads(device):
        if label.split()[0] == name:
            return label, fn, args
    raise SystemExit(f"no workload named {name!r}")


def profile(label: str, fn, args, device: str, steps: int, rows: int) -> None:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    for _ in range(3):
        fn(*args)
    synchronize(device)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            fn(*args)
        synchronize(device)
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    print(f"\n## {label}: {steps} calls")
    if device == "cuda":
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        launches = sum(e.count for e in kernels) / steps
        total = sum(e.self_device_time_total for e in kernels) / steps / 1e3
        print(f"GPU kernels per call: {launches:.0f}; GPU time per call: {total:.3f} ms")
    print(events.table(sort_by=key, row_limit=rows, max_name_column_width=90))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--workload", default="bert")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--backends", nargs="+", default=["eager", "inductor", "kiln"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the model's parameters (and floating inputs) in this dtype")
    options = parser.parse_args()
    label, fn, args = _find(options.workload, options.device)
    if options.dtype != "float32":
        dtype = getattr(torch, options.dtype)
        fn = fn.to(dtype) if isinstance(fn, torch.nn.Module) else fn
        args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
        label += f" {options.dtype}"
    with torch.no_grad():
        for name in options.backends:
            torch._dynamo.reset()
            if name == "eager":
                compiled = fn
            else:
                counting = CountingBackend(kiln_backend) if name == "kiln" else None
                compiled = torch.compile(fn, backend=counting or name)
                compiled(*args)
                if counting is not None and counting.calls == 0:
                    raise RuntimeError("Dynamo never called the kiln backend")
            profile(f"{label} [{name}]", compiled, args, options.device, options.steps, options.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
