"""Points per thread of 16-bit pointwise kernels against their register count, on a GPU (issue 14).

    PYTHONPATH=<packages/*/src>:integration/src:tools python tools/pointwise_block_probe.py [--dtypes bfloat16 float16]

How codegen_triton's `runtime._WIDE_POINTWISE_MAX_REGISTERS` was chosen (BENCHMARKS.md session 22):
for a set of pointwise ops of one to three transcendental functions, kiln's own kernel (the lowering
its GPU backend runs) over 2^26 elements is timed (`bench_gpu_rows.bench`: CUDA graph replays) with
16 values a thread (twice `xblock`, 4 warps: the wide form) and 8 (`xblock`), beside Inductor, and
the wide form's registers a thread are read from its compiled kernel. Then the codegen's own choice
(by registers) is timed too. Each cell is % of the measured copy bandwidth of the dtype.
"""

from __future__ import annotations

import argparse
import functools
import gc
import pathlib
import tempfile

import torch
import torch.nn.functional as F
from bench_gpu_rows import bench, pointwise
from sweep_reduction_blocks import kernel_graph, microseconds

from kiln.codegen_triton import TritonOptions
from kiln.codegen_triton._internal import runtime

OPS = {
    "sigmoid(x) * x + tanh(x) / 2": pointwise,
    "sigmoid * tanh": lambda t: torch.sigmoid(t) * torch.tanh(t),
    "exp(-|x|) + log1p(|x|)": lambda t: torch.exp(-t.abs()) + torch.log1p(t.abs()),
    "sin + cos": lambda t: torch.sin(t) + torch.cos(t),
    "gelu * sigmoid": lambda t: F.gelu(t) * torch.sigmoid(t),
    "sigmoid + tanh + exp(-|x|)": lambda t: torch.sigmoid(t) + torch.tanh(t) + torch.exp(-t.abs()),
    "gelu": lambda t: F.gelu(t),
    "tanh gelu": lambda t: F.gelu(t, approximate="tanh"),
    "silu": lambda t: F.silu(t),
    "exp": torch.exp,
    "sin": torch.sin,
    "erf": torch.erf,
    "rsqrt(|x| + 1)": lambda t: torch.rsqrt(t.abs() + 1),
    "x * 2 + 1": lambda t: t * 2 + 1,
}


def _jit_functions() -> list:
    """Every live JITFunction (gc's objects include dead weak proxies: skipped)."""
    from triton.runtime.jit import JITFunction

    found = []
    for item in gc.get_objects():
        try:
            if isinstance(item, JITFunction):
                found.append(item)
        except ReferenceError:
            continue
    return found


def _new_registers(before: set[int]) -> list[int]:
    """Registers a thread of each Triton kernel compiled since `before` (ids of JITFunctions)."""
    found = []
    for function in _jit_functions():
        if id(function) not in before:
            for cache in getattr(function, "device_caches", {}).values():
                for compiled in cache[0].values():
                    compiled._init_handles()
                    found.append(int(compiled.n_regs))
    return found


def _jit_ids() -> set[int]:
    return {id(function) for function in _jit_functions()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"], choices=["bfloat16", "float16"])
    parser.add_argument("--elements", type=int, default=1 << 26)
    args = parser.parse_args()
    cache = pathlib.Path(tempfile.mkdtemp())
    print("| op | dtype | Inductor % | 16 a thread % | 8 a thread % | registers (16) | kiln's choice % "
          f"(limit {runtime._WIDE_POINTWISE_MAX_REGISTERS}) |")
    print("|---|---|---|---|---|---|---|")
    for dtype_name in args.dtypes:
        x = torch.randn(args.elements // 4096, 4096, device="cuda", dtype=getattr(torch, dtype_name))
        nbytes = 2 * x.numel() * x.element_size()
        copy = nbytes / bench(functools.partial(torch.Tensor.copy_, torch.empty_like(x), x))
        for name, fn in OPS.items():
            print(f"| {name} | {dtype_name} | " + " | ".join(_row(fn, x, cache / dtype_name, nbytes / copy)) + " |",
                  flush=True)


def _row(fn, x: torch.Tensor, cache: pathlib.Path, copy_seconds: float) -> list[str]:
    """Inductor, wide, narrow, the wide form's registers, kiln's choice: one table row's cells."""
    limit = runtime._WIDE_POINTWISE_MAX_REGISTERS
    torch._dynamo.reset()
    inductor = torch.compile(fn)
    inductor(x)
    cells = [f"{100 * copy_seconds / bench(functools.partial(inductor, x)):.1f}"]
    graph = kernel_graph(fn, (x,))
    registers = []
    for tag, wide_limit, xblock in (("wide", 1 << 30, 1024), ("narrow", 1 << 30, 512), ("rule", limit, 1024)):
        runtime._WIDE_POINTWISE_MAX_REGISTERS = wide_limit
        before = _jit_ids()
        try:
            options = TritonOptions(cache_dir=cache / tag, compile_threads=0, xblock=xblock)
            cells.append(f"{100 * copy_seconds / (microseconds(graph, (x,), options) / 1e6):.1f}")
        finally:
            runtime._WIDE_POINTWISE_MAX_REGISTERS = limit
        if tag == "wide":
            registers = _new_registers(before)
    cells.insert(3, ",".join(map(str, registers)))
    return cells


if __name__ == "__main__":
    main()
