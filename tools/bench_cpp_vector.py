"""The C++ codegen's explicit vector code against its scalar path, per class of workload (issue 12).

    python tools/bench_cpp_vector.py [--widths 1024 4096 16384] [--threads 1 2] [--repeat 200]
                                     [--elements 2097152] [--only softmax layer_norm ...]

Every workload (pointwise chains of transcendental ops, gelu, softmax, layer norm, rmsnorm,
var_mean, reductions over the inner dim, over dim 0 and over a transposed input, a transposed
add, bfloat16 softmax and layer norm) is captured once by Dynamo, then compiled twice by the
kiln backend (``fallback=False``): with ``KILN_CPP_VECTORIZE=1`` (kiln's SIMD layer) and ``=0``
(scalar C++ left to GCC's auto-vectorizer and libmvec). Both run in this process, interleaved
call by call (the order alternating), so both see the same machine state. Per call it records
the wall time and the process CPU time (`time.process_time_ns`: what a shared machine's other
processes do not inflate, but spinning OpenMP threads do); the table gives the medians and
vector/scalar ratios (> 1: the vector path is faster). Each variant's result is checked
against eager, and the vector variant's source must hold vector code.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from workloads import layer_norm_rows, rmsnorm_rows, softmax_rows, sum_first_dim, var_mean_rows

from kiln.integration import backend as kiln_backend
from kiln.integration import explain


def chain_sigmoid_tanh(x):
    return x * torch.sigmoid(x) + torch.tanh(x) * 0.5 - torch.relu(-x)


def chain_exp_log1p(x):
    return torch.exp(-x * x) + torch.log1p(x.abs())


def gelu_erf(x):
    return F.gelu(x)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def sum_amax(x):
    return x.sum(-1), x.amax(-1)


def transposed_mean(xt):
    return xt.t().mean(-1)


def transpose_add(x, yt):
    return x + yt.t()


# name -> (function, the dtype of its inputs, which inputs it takes)
WORKLOADS: dict[str, tuple[Callable[..., Any], torch.dtype, str]] = {
    "sigmoid/tanh chain": (chain_sigmoid_tanh, torch.float32, "x"),
    "exp/log1p chain": (chain_exp_log1p, torch.float32, "x"),
    "gelu (erf)": (gelu_erf, torch.float32, "x"),
    "gelu (tanh)": (gelu_tanh, torch.float32, "x"),
    "softmax": (softmax_rows, torch.float32, "x"),
    "layer_norm": (layer_norm_rows, torch.float32, "xwb"),
    "rmsnorm": (rmsnorm_rows, torch.float32, "xw"),
    "var_mean": (var_mean_rows, torch.float32, "x"),
    "sum+amax(-1)": (sum_amax, torch.float32, "x"),
    "sum(0)": (sum_first_dim, torch.float32, "x"),
    "transposed mean": (transposed_mean, torch.float32, "t"),
    "transpose+add": (transpose_add, torch.float32, "xt"),
    "softmax bf16": (softmax_rows, torch.bfloat16, "x"),
    "layer_norm bf16": (layer_norm_rows, torch.bfloat16, "xwb"),
}


def make_inputs(which: str, rows: int, width: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    made = {"x": lambda: torch.randn(rows, width, generator=generator).to(dtype),
            "w": lambda: torch.randn(width, generator=generator).to(dtype),
            "b": lambda: torch.randn(width, generator=generator).to(dtype),
            "t": lambda: torch.randn(width, rows, generator=generator).to(dtype)}
    return tuple(made[key]() for key in which)


def capture_graph(fn: Callable[..., Any], args: tuple) -> tuple[torch.fx.GraphModule, list]:
    """The FX graph Dynamo makes of `fn(*args)` (one graph) and its example inputs."""
    captured: list = []

    def capture(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        captured.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=capture, dynamic=False)(*args)
    torch._dynamo.reset()
    if len(captured) != 1:
        raise RuntimeError(f"{fn.__name__}: Dynamo made {len(captured)} graphs, expected 1")
    return captured[0]


def compile_variant(fn: Callable[..., Any], args: tuple, vectorize: bool, cache_dir: str) -> Callable[..., Any]:
    """`fn` compiled by the kiln backend with vector code on or off; checks that kiln compiled
    everything (explain: kernels ran, nothing fell back) and that the vector variant is vector code."""
    os.environ["KILN_CPP_VECTORIZE"] = "1" if vectorize else "0"
    options = {"fallback": False, "cache_dir": cache_dir}
    report = explain(fn, *args, options=options)
    graph = report.graphs[0]
    if not graph.compiled or graph.kernels == 0 or graph.fallback_nodes:
        raise RuntimeError(f"{fn.__name__}: kiln compiled {graph.kernels} kernels, fallbacks {graph.fallback_nodes}")
    if vectorize and "// vector code" not in graph.source:
        raise RuntimeError(f"{fn.__name__}: the vector variant has no vector code")
    gm, example_inputs = capture_graph(fn, args)
    module = kiln_backend(gm, example_inputs, options=options)
    expected = fn(*args)
    got = module(*example_inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for want, have in zip(expected, got, strict=True):
        torch.testing.assert_close(have, want, atol=2e-2 if want.dtype == torch.bfloat16 else 1e-4, rtol=1e-2,
                                   equal_nan=True)
    return lambda: module(*example_inputs)


def interleaved(calls: dict[str, Callable[[], Any]], repeat: int) -> dict[str, tuple[float, float]]:
    """Median wall and process-CPU milliseconds per call of each callable, called in turn."""
    names = list(calls)
    wall: dict[str, list[int]] = {n: [] for n in names}
    cpu: dict[str, list[int]] = {n: [] for n in names}
    for name in names:  # warm up
        for _ in range(3):
            calls[name]()
    for rep in range(repeat):
        for name in (names if rep % 2 == 0 else names[::-1]):
            start_cpu, start = time.process_time_ns(), time.perf_counter_ns()
            calls[name]()
            wall[name].append(time.perf_counter_ns() - start)
            cpu[name].append(time.process_time_ns() - start_cpu)
    return {n: (statistics.median(wall[n]) / 1e6, statistics.median(cpu[n]) / 1e6) for n in names}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--elements", type=int, default=2 ** 21, help="elements per input (rows = elements / width)")
    parser.add_argument("--only", nargs="+", choices=list(WORKLOADS), help="these workloads only")
    options = parser.parse_args()
    cache_dir = tempfile.mkdtemp(prefix="kiln-bench-vector-")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    print("| workload | width | threads | vector ms | scalar ms | vector/scalar (wall) "
          "| vector CPU ms | scalar CPU ms | vector/scalar (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios: dict[int, list[float]] = {t: [] for t in options.threads}
    with torch.no_grad():
        for name in options.only or WORKLOADS:
            fn, dtype, which = WORKLOADS[name]
            for width in options.widths:
                args = make_inputs(which, max(1, options.elements // width), width, dtype)
                torch.set_num_threads(max(options.threads))
                calls = {"vector": compile_variant(fn, args, True, cache_dir),
                         "scalar": compile_variant(fn, args, False, cache_dir)}
                for threads in options.threads:
                    torch.set_num_threads(threads)
                    got = interleaved(calls, options.repeat)
                    (vw, vc), (sw, sc) = got["vector"], got["scalar"]
                    ratios[threads].append(sc / vc)
                    print(f"| {name} | {width} | {threads} | {vw:.3f} | {sw:.3f} | {sw / vw:.2f}x | {vc:.3f} "
                          f"| {sc:.3f} | {sc / vc:.2f}x |", flush=True)
    for threads, values in ratios.items():
        print(f"geometric mean of scalar/vector CPU time, {threads} thread(s): "
              f"{statistics.geometric_mean(values):.3f}x (min {min(values):.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
