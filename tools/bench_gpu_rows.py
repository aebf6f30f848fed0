"""Memory-bound GPU workloads at several row lengths and dtypes: eager, Inductor and kiln (issue 14).

    python tools/bench_gpu_rows.py [--widths 1024 4096 16384] [--dtypes float32 bfloat16] [--out rows.md]

Each workload reads and writes about `--elements` elements (2^26 by default) arranged as rows of
each width: softmax, layer norm, rmsnorm, var_mean and sum over the last dim, sum over dim 0, a
transposed add (read transposed, write contiguous), a pointwise chain, a group norm (8-row
blocks as channels in 4 groups, per-channel weight and bias). For every row: median
time of each backend (`triton.testing.do_bench`, L2 flushed between calls), the bytes the
workload must move (inputs once, outputs once) over that time as a percentage of the measured
device-to-device copy bandwidth, and kiln/Inductor. kiln runs with ``fallback=False`` and its
backend calls are counted (a row where kiln compiled nothing is an error). `--kiln-paths NAME=DIR`
adds a kiln column per entry whose package sources are taken from DIR first (a before/after
comparison in one run: DIR holds another checkout's `packages/*/src` joined by ':'); a DIR ending
in `@MODE` runs that kiln with torch.compile's mode=MODE (e.g. `tuned=$PYTHONPATH@max-autotune-no-cudagraphs`).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import subprocess
import sys

import torch
from workloads import (
    group_norm_rows,
    layer_norm_rows,
    rmsnorm_rows,
    softmax_rows,
    sum_first_dim,
    var_mean_rows,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sum_last(x):
    return x.sum(-1)


def transpose_add(x, y):
    return x.t() + y


def pointwise(x):
    return torch.sigmoid(x) * x + torch.tanh(x) * 0.5


def cases(width: int, dtype: torch.dtype, elements: int):
    """(name, fn, args) of every workload at one width and dtype, on the GPU."""
    rows = max(8, elements // width // 8 * 8)  # group_norm_rows views 8 rows as channels
    x = torch.randn(rows, width, device="cuda", dtype=dtype)
    w, b = torch.randn(width, device="cuda", dtype=dtype), torch.randn(width, device="cuda", dtype=dtype)
    yt = torch.randn(width, rows, device="cuda", dtype=dtype)
    wc, bc = torch.randn(8, device="cuda", dtype=dtype), torch.randn(8, device="cuda", dtype=dtype)
    return [
        ("softmax", softmax_rows, (x,)), ("layer_norm", layer_norm_rows, (x, w, b)), ("rmsnorm", rmsnorm_rows, (x, w)),
        ("var_mean", var_mean_rows, (x,)), ("sum(-1)", sum_last, (x,)), ("sum(0)", sum_first_dim, (x,)),
        ("transpose+add", transpose_add, (x, yt)), ("pointwise", pointwise, (x,)),
        ("group_norm", group_norm_rows, (x, wc, bc)),
    ]


def moved_bytes(fn, args) -> int:
    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    return sum(t.numel() * t.element_size() for t in (*args, *outs))


def bench(fn) -> float:
    """Median seconds per call. With BENCH_GRAPHS=1 (`--graphs`) a call is a replay of `fn`
    captured as a CUDA graph: GPU time only, without the host's per-call time (which on a busy
    host is as long as these kernels and varies from run to run)."""
    from triton.testing import do_bench
    if os.environ.get("BENCH_GRAPHS") == "1":
        fn()  # compiled, tuned and warm before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        fn = graph.replay
    return do_bench(fn, warmup=10, rep=50, return_mode="median") / 1e3


def copy_bandwidth(dtype: torch.dtype) -> float:
    """Device-to-device copy of 1 GiB of `dtype` (16-bit elements move fewer bytes per thread)."""
    a = torch.empty((1 << 30) // torch.empty((), dtype=dtype).element_size(), device="cuda", dtype=dtype)
    b = torch.empty_like(a)
    from triton.testing import do_bench  # not bench(): a copy is one launch either way
    return 2 * a.numel() * a.element_size() / (do_bench(lambda: b.copy_(a), warmup=10, rep=50, return_mode="median") / 1e3)


class Counting:
    def __init__(self, backend):
        self.backend, self.calls = backend, 0

    def __call__(self, gm, example_inputs):
        self.calls += 1
        return self.backend(gm, example_inputs)


def kiln_seconds(fn, args, want) -> tuple[float, float]:
    """(seconds per call, max error against eager) of kiln in this process."""
    from kiln.integration import backend
    torch._dynamo.reset()
    mode = os.environ.get("BENCH_KILN_MODE") or None
    counting = Counting(functools.partial(backend, options={"fallback": False}, mode=mode))
    compiled = torch.compile(fn, backend=counting)
    got = compiled(*args)
    if counting.calls == 0:
        raise RuntimeError("Dynamo never called kiln")
    gots, wants = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    error = max(float((g.float() - w.float()).abs().max()) for g, w in zip(gots, wants))
    return bench(lambda: compiled(*args)), error


def worker(width: int, dtype_name: str, elements: int) -> None:
    """Run in a subprocess with another checkout's sources first on sys.path: kiln times only."""
    results = {}
    if os.environ.get("BENCH_KILN_MODE", "").startswith("max-autotune"):  # the tuning choices, on stderr
        logging.basicConfig(level=logging.WARNING)
        logging.getLogger("kiln.codegen_triton").setLevel(logging.INFO)
    only = os.environ.get("BENCH_WORKLOADS")
    for name, fn, args in cases(width, DTYPES[dtype_name], elements):
        if only is None or name in only.split(","):
            results[name], error = kiln_seconds(fn, args, fn(*args))
            print(f"kiln error {name} {width} {dtype_name}: {error:.1e}", file=sys.stderr)
    print("RESULT " + json.dumps(results))


def other_kiln(path: str, width: int, dtype_name: str, elements: int) -> dict[str, float]:
    path, _, mode = path.partition("@")
    env = {**os.environ, "PYTHONPATH": path + os.pathsep + os.environ.get("PYTHONPATH", ""), "BENCH_KILN_MODE": mode}
    return worker_results(__file__, [str(width), dtype_name, str(elements)], env)


def worker_results(script: str, worker_args: list[str], env: dict[str, str]) -> dict[str, float]:
    """The times a `script --worker ...` subprocess prints on its RESULT line (its errors to stderr)."""
    done = subprocess.run([sys.executable, script, "--worker", *worker_args],
                          env=env, capture_output=True, text=True, timeout=900)
    print("\n".join(line for line in done.stderr.splitlines()
                    if line.startswith("kiln error") or "tuned" in line or "failed" in line), file=sys.stderr)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    print(done.stdout[-2000:], done.stderr[-3000:], file=sys.stderr)
    return {}


def eager_and_inductor(fn, args) -> tuple[int, float, float]:
    """(bytes the workload must move, eager seconds, Inductor seconds)."""
    nbytes = moved_bytes(fn, args)
    eager = bench(lambda: fn(*args))
    torch._dynamo.reset()
    inductor_fn = torch.compile(fn)
    inductor_fn(*args)
    return nbytes, eager, bench(lambda: inductor_fn(*args))


def kiln_or_nan(fn, args, want, where: str) -> tuple[float, float]:
    """`kiln_seconds`, or NaNs when kiln fails (reported: the table goes on)."""
    try:
        return kiln_seconds(fn, args, want)
    except Exception as exc:  # noqa: BLE001 - a failing row is reported, the table goes on
        print(f"kiln failed on {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return float("nan"), float("nan")


def percent_of_copy(nbytes: int, bandwidth: float):
    """seconds -> the text of nbytes / seconds as a % of `bandwidth` ("-" for no time)."""
    def pct(seconds: float) -> str:
        return f"{100 * nbytes / seconds / bandwidth:.1f}" if seconds == seconds and seconds else "-"
    return pct


def measure_row(name, fn, args, width: int, dtype_name: str, bandwidth: float, others: list[float]) -> str:
    """One table row: eager, Inductor, kiln (and other kiln checkouts' times) as % of copy."""
    want = fn(*args)
    nbytes, eager, inductor = eager_and_inductor(fn, args)
    kiln, error = kiln_or_nan(fn, args, want, f"{name} {width} {dtype_name}")
    pct = percent_of_copy(nbytes, bandwidth)
    row = [name, str(width), dtype_name, pct(eager), pct(inductor), pct(kiln), *map(pct, others),
           f"{inductor / kiln:.2f}x", f"{error:.1e}"]
    return "| " + " | ".join(row) + " |"


class Table:
    """A markdown table of rows, printed as they come (and written to `out` after each)."""

    def __init__(self, head: list[str], bandwidths: dict[str, float], graphs: bool, out: str | None) -> None:
        copies = ", ".join(f"{name} {bandwidth / 1e9:.0f} GB/s" for name, bandwidth in bandwidths.items())
        self.lines = [f"{torch.cuda.get_device_name()}, copy bandwidth {copies}; % = bytes moved / time / copy "
                      "bandwidth of the row's dtype" + ("; times of CUDA graph replays (GPU time)" if graphs else ""),
                      "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        self.out = out
        print("\n".join(self.lines), flush=True)

    def add(self, row: str) -> None:
        self.lines.append(row)
        print(row, flush=True)
        if self.out:
            with open(self.out, "w") as f:
                f.write("\n".join(self.lines) + "\n")


def row_arguments(doc: str) -> argparse.ArgumentParser:
    """The arguments every row bench takes: widths, dtypes, elements, --graphs, --out (and --worker)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--widths", nargs="+", type=int, default=[1024, 4096, 16384])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES))
    parser.add_argument("--elements", type=int, default=1 << 26)
    parser.add_argument("--graphs", action="store_true", help="time CUDA graph replays (GPU time only)")
    parser.add_argument("--out")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = row_arguments(__doc__)
    parser.add_argument("--workloads", nargs="+", help="only these workload names")
    parser.add_argument("--kiln-paths", nargs="*", default=[], metavar="NAME=PATH")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    if args.worker:
        worker(int(args.worker[0]), args.worker[1], int(args.worker[2]))
        return
    if args.graphs:  # read by bench(), here and in the other checkouts' workers
        os.environ["BENCH_GRAPHS"] = "1"
    others = dict(item.split("=", 1) for item in args.kiln_paths)
    if args.workloads:  # the other checkouts' workers time these only
        os.environ["BENCH_WORKLOADS"] = ",".join(args.workloads)
    bandwidths = {name: copy_bandwidth(DTYPES[name]) for name in args.dtypes}
    head = (["workload", "width", "dtype", "eager %", "Inductor %", "kiln %"] + [f"kiln[{n}] %" for n in others]
            + ["kiln/Inductor", "kiln err"])
    table = Table(head, bandwidths, args.graphs, args.out)
    for dtype_name in args.dtypes:
        for width in args.widths:
            extra = {name: other_kiln(path, width, dtype_name, args.elements) for name, path in others.items()}
            for name, fn, fargs in cases(width, DTYPES[dtype_name], args.elements):
                if args.workloads and name not in args.workloads:
                    continue
                table.add(measure_row(name, fn, fargs, width, dtype_name, bandwidths[dtype_name],
                                      [extra[n].get(name, float("nan")) for n in others]))


if __name__ == "__main__":
    main()
