"""Row fusion on a GPU: softmax and layer norm through loopir + codegen_triton alone.

    PYTHONPATH=packages/loopir/src:packages/codegen_triton/src python packages/codegen_triton/tools/bench_rows.py

For each workload: eager (the same Python function, and torch's fused op), Inductor on the same
function, and kiln with `fuse_rows=False` (one kernel per reduction / pointwise step) and
`fuse_rows=True` (one kernel with row loops) under a few launch block sizes (XBLOCK x RBLOCK). Times are medians
of per-call wall time with a device synchronize (host overhead included), in ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonOptions, compile
from kiln.loopir import lower

VARIANTS = [  # (label, fuse_rows, TritonOptions fields)
    ("fuse_rows=False, blocks 8x128 (before)", False, {"contiguous_rblock": 128}),
    ("fuse_rows=False, defaults", False, {}),
    ("fuse_rows=True, blocks 8x128", True, {"contiguous_rblock": 128}),
    ("fuse_rows=True, blocks 2x512", True, {"contiguous_rblock": 512}),
    ("fuse_rows=True, defaults (1x1024)", True, {}),
    ("fuse_rows=True, 1x1024, num_warps=8", True, {"num_warps": 8}),
    ("fuse_rows=True, 1x2048, num_warps=8", True, {"contiguous_rblock": 2048, "num_warps": 8}),
]


def softmax(x):
    e = torch.exp(x - torch.amax(x, -1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def layer_norm(x, weight, bias):
    mean = x.mean(-1, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keepdim=True)
    return centered * torch.rsqrt(var + 1e-5) * weight + bias


def median_ms(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def kiln_module(fn, args, fuse_rows: bool, fields: dict):
    kernel_graph = lower(make_fx(fn)(*args), fuse_rows=fuse_rows)
    options = TritonOptions(cache_dir=tempfile.mkdtemp(prefix="kiln-rows-"), **fields)
    return compile(kernel_graph, options), len(kernel_graph.kernels)


def bench(name, fn, aten_op, args, repeat: int) -> list[list[str]]:
    expected = fn(*args)
    rows = [[name, "eager (this function)", "-", f"{median_ms(lambda: fn(*args), repeat):.3f}", "-"],
            [name, "eager (torch op)", "-", f"{median_ms(lambda: aten_op(*args), repeat):.3f}", "-"]]
    inductor = torch.compile(fn, backend="inductor")
    inductor(*args)
    rows.append([name, "inductor", "-", f"{median_ms(lambda: inductor(*args), repeat):.3f}",
                 f"{(inductor(*args) - expected).abs().max().item():.1e}"])
    for label, fuse_rows, fields in VARIANTS:
        module, kernels = kiln_module(fn, args, fuse_rows, fields)
        error = (module(*args) - expected).abs().max().item()
        ms = median_ms(lambda m=module: m(*args), repeat)
        rows.append([name, f"kiln {label}", str(kernels), f"{ms:.3f}", f"{error:.1e}"])
    return rows


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(lines + ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=50)
    options = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(options.rows, options.cols, device="cuda")
    weight, bias = torch.randn(options.cols, device="cuda"), torch.randn(options.cols, device="cuda")
    shape = f"{options.rows}x{options.cols}"
    rows = bench(f"softmax {shape}", softmax, lambda x: torch.softmax(x, -1), (x,), options.repeat)
    rows += bench(f"layer_norm {shape}", layer_norm,
                  lambda x, w, b: torch.nn.functional.layer_norm(x, (options.cols,), w, b), (x, weight, bias),
                  options.repeat)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(table(["workload", "variant", "kernels", "ms", "max err"], rows))


if __name__ == "__main__":
    main()
