"""`nox -s bench`: eager vs Inductor vs kiln on CPU, median run times and compile times.

Every number is measured in this run. Ratios > 1 mean kiln is faster. The kiln backend is
wrapped in a call counter: a row where Dynamo never called kiln is reported as an error.
The three are timed interleaved (one call of each per round, `--repeat` rounds, medians), so
load from other processes falls on all three alike. `--suite channels-last` runs the
channels-last ConvNet block rows alone, `--suite wide` the wider CPU rows of issue 12
(tools/bench_cpu_rows.py: reductions by layout, normalizations by width, MLPs, a training step).
The last lines give the geometric mean of kiln's speed-up over Inductor and the lowest row.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import tempfile
import time

import torch
from bench_cpu_rows import inference_rows, training_rows
from workloads import (
    CountingBackend,
    channels_last_workloads,
    interleaved_medians,
    max_error,
    model_workloads,
    table,
    workloads,
)

from kiln.integration import backend as kiln_backend


def compile_timed(fn, args, backend) -> tuple:
    """`torch.compile(fn, backend=backend)` and the seconds of its first call. Unlike
    `compile_and_time`, Dynamo is not reset: both compiled versions stay cached, to be timed
    in turns (each entry is guarded by its backend)."""
    compiled = torch.compile(fn, backend=backend)
    start = time.perf_counter()
    compiled(*args)
    return compiled, time.perf_counter() - start


def bench_one(name, fn, args, repeat: int, device: str) -> list[str]:
    eager_out = fn(*args)
    torch._dynamo.reset()
    inductor_fn, inductor_compile = compile_timed(fn, args, "inductor")
    # A fresh code cache per workload: compile times include building the generated code.
    fresh_cache = tempfile.mkdtemp(prefix="kiln-bench-")
    counting = CountingBackend(functools.partial(kiln_backend, options={"cache_dir": fresh_cache}))
    kiln_fn, kiln_compile = compile_timed(fn, args, counting)
    times = interleaved_medians({"eager": lambda: fn(*args), "inductor": lambda: inductor_fn(*args),
                                 "kiln": lambda: kiln_fn(*args)}, repeat, device=device)
    eager, inductor, kiln = times["eager"], times["inductor"], times["kiln"]
    if counting.calls == 0:
        raise RuntimeError(f"{name}: Dynamo never called the kiln backend")
    kiln_out = kiln_fn(*args)
    with torch.no_grad():
        error = max_error(kiln_out, eager_out)
    return [name, f"{eager * 1e3:.3f}", f"{inductor * 1e3:.3f}", f"{kiln * 1e3:.3f}",
            f"{eager / kiln:.2f}x", f"{inductor / kiln:.2f}x", f"{inductor_compile:.2f}",
            f"{kiln_compile:.2f}", f"{error:.1e}"]


def chosen_rows(suite: str, device: str) -> list[tuple]:
    """The rows of `suite` as (name, fn, args, training): training rows run with autograd on."""
    chosen = []
    if suite in ("micro", "all"):
        chosen += workloads(device)
    if suite == "channels-last":
        chosen += channels_last_workloads(device)
    if suite in ("wide", "all"):
        chosen += inference_rows(device)
    if suite in ("models", "all"):
        chosen += model_workloads(device)
    rows = [(name, fn, args, False) for name, fn, args in chosen]
    if suite in ("wide", "all"):
        rows += [(name, fn, args, True) for name, fn, args in training_rows(device)]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--suite", default="all", choices=["micro", "models", "channels-last", "wide", "all"],
                        help="micro: small graphs (the channels-last rows included); models: Hugging Face "
                             "BERT/GPT-2/Llama from configs; channels-last: the ConvNet block rows alone; "
                             "wide: reductions by layout, norms by width, MLPs, a training step")
    parser.add_argument("--cpp-vectorize", choices=["default", "on", "off"], default="default",
                        help="the C++ codegen's explicit vector code (CppOptions.vectorize, on by default; "
                             "set through KILN_CPP_VECTORIZE): compare `on` with `off` in two runs, or per "
                             "workload class in one process with tools/bench_cpp_vector.py")
    options = parser.parse_args()
    if options.cpp_vectorize != "default":
        os.environ["KILN_CPP_VECTORIZE"] = "1" if options.cpp_vectorize == "on" else "0"
    where = torch.cuda.get_device_name() if options.device == "cuda" else f"{torch.get_num_threads()} CPU threads"
    vectorize = os.environ.get("KILN_CPP_VECTORIZE") or "the default (on)"
    print(f"torch {torch.__version__}, {where}, C++ vectorize: {vectorize}")
    rows = []
    for name, fn, args, training in chosen_rows(options.suite, options.device):
        with contextlib.nullcontext() if training else torch.no_grad():
            rows.append(bench_one(name, fn, args, options.repeat, options.device))
        print(f"done: {name}", file=sys.stderr)
    print(table(["workload", "eager ms", "inductor ms", "kiln ms", "kiln vs eager", "kiln vs inductor",
                 "inductor compile s", "kiln compile s", "max err"], rows))
    speedups = [float(row[2]) / float(row[3]) for row in rows]  # inductor ms / kiln ms
    lowest = min(zip(speedups, (row[0] for row in rows)))
    print(f"kiln vs inductor: geometric mean {statistics.geometric_mean(speedups):.3f}x over {len(rows)} rows, "
          f"lowest {lowest[0]:.2f}x ({lowest[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
