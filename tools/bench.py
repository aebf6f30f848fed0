"""`nox -s bench`: eager vs Inductor vs kiln on CPU, median run times and compile times.

Every number is measured in this run. Ratios > 1 mean kiln is faster. The kiln backend is
wrapped in a call counter: a row where Dynamo never called kiln is reported as an error.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile

import torch
from workloads import (
    CountingBackend,
    compile_and_time,
    max_error,
    median_seconds,
    model_workloads,
    table,
    workloads,
)

from kiln.integration import backend as kiln_backend


def bench_one(name, fn, args, repeat: int, device: str) -> list[str]:
    eager_out = fn(*args)
    eager = median_seconds(lambda: fn(*args), repeat, device=device)
    inductor_fn, inductor_compile, _ = compile_and_time(fn, args, "inductor")
    inductor = median_seconds(lambda: inductor_fn(*args), repeat, device=device)
    # A fresh code cache per workload: compile times include building the generated code.
    fresh_cache = tempfile.mkdtemp(prefix="kiln-bench-")
    counting = CountingBackend(functools.partial(kiln_backend, options={"cache_dir": fresh_cache}))
    kiln_fn, kiln_compile, _ = compile_and_time(fn, args, counting)
    kiln = median_seconds(lambda: kiln_fn(*args), repeat, device=device)
    if counting.calls == 0:
        raise RuntimeError(f"{name}: Dynamo never called the kiln backend")
    error = max_error(kiln_fn(*args), eager_out)
    return [name, f"{eager * 1e3:.3f}", f"{inductor * 1e3:.3f}", f"{kiln * 1e3:.3f}",
            f"{eager / kiln:.2f}x", f"{inductor / kiln:.2f}x", f"{inductor_compile:.2f}",
            f"{kiln_compile:.2f}", f"{error:.1e}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--suite", default="all", choices=["micro", "models", "all"],
                        help="micro: small graphs; models: Hugging Face BERT/GPT-2/Llama from configs")
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
    with torch.no_grad():
        chosen = []
        if options.suite in ("micro", "all"):
            chosen += workloads(options.device)
        if options.suite in ("models", "all"):
            chosen += model_workloads(options.device)
        for name, fn, args in chosen:
            rows.append(bench_one(name, fn, args, options.repeat, options.device))
            print(f"done: {name}", file=sys.stderr)
    print(table(["workload", "eager ms", "inductor ms", "kiln ms", "kiln vs eager", "kiln vs inductor",
                 "inductor compile s", "kiln compile s", "max err"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
