"""Layer norm and rmsnorm rows on a GPU: kiln and Inductor against hand-written Triton variants.

    PYTHONPATH=$(ls -d $PWD/packages/*/src | tr '\n' ':')$PWD/integration/src \
        OUT=/tmp/probe python tools/norm_row_probe.py

For float32 and bfloat16 rows of 4096 and 16384 (2^26 elements in all), times (CUDA-graph replays,
L2 flushed: `bench_gpu_rows.bench` with BENCH_GRAPHS=1) Inductor, kiln (``fallback=False``) and
hand kernels: the row held in registers and loaded once (XBLOCK 1 or 2, 4 to 16 warps, weight loads
with or without ``evict_last``, with or without masks) and, for layer norm at 4096, a three-loop
kernel with and without eviction hints. Prints the eight fastest per row as % of a copy measured
in the same run; writes them to $OUT/probe.md and Inductor's generated code to $OUT/codes.txt.
How session 19 checked whether kiln's norm kernels leave bandwidth on the table (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
os.environ["BENCH_GRAPHS"] = "1"
from bench_gpu_rows import bench, copy_bandwidth  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402
from workloads import layer_norm_rows, rmsnorm_rows  # noqa: E402

from kiln.integration import backend  # noqa: E402

OUT = os.environ.get("OUT", ".")


@triton.jit
def _held_row(x_ptr, row, r, N: tl.constexpr, MASKED: tl.constexpr):
    """XBLOCK whole rows of `x` as float32, loaded once (with or without an all-true mask)."""
    if MASKED:
        return tl.load(x_ptr + row * N + r, (r < N) & (row >= 0), other=0.0).to(tl.float32)
    return tl.load(x_ptr + row * N + r).to(tl.float32)


@triton.jit
def _weight(w_ptr, r, EVW: tl.constexpr):
    """A per-column weight as float32, `evict_last` when EVW (it is read by every row)."""
    if EVW:
        return tl.load(w_ptr + r, eviction_policy="evict_last").to(tl.float32)
    return tl.load(w_ptr + r).to(tl.float32)


@triton.jit
def ln_persist(x_ptr, w_ptr, b_ptr, o_ptr, N: tl.constexpr, XBLOCK: tl.constexpr, EVW: tl.constexpr,
               MASKED: tl.constexpr):
    row = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    r = tl.arange(0, N)[None, :]
    x = _held_row(x_ptr, row, r, N, MASKED)
    w = _weight(w_ptr, r, EVW)
    b = _weight(b_ptr, r, EVW)
    mean = tl.sum(x, 1)[:, None] / N
    xc = x - mean
    var = tl.sum(xc * xc, 1)[:, None] / N
    y = xc * tl.rsqrt(var + 1e-5) * w + b
    tl.store(o_ptr + row * N + r, y.to(o_ptr.dtype.element_ty))


@triton.jit
def ln_loop(x_ptr, w_ptr, b_ptr, o_ptr, N: tl.constexpr, RBLOCK: tl.constexpr, EV: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([RBLOCK], tl.float32)
    for off in range(0, N, RBLOCK):
        r = off + tl.arange(0, RBLOCK)
        acc += tl.load(x_ptr + row * N + r, eviction_policy="evict_last" if EV else "").to(tl.float32)
    mean = tl.sum(acc, 0) / N
    acc = tl.zeros([RBLOCK], tl.float32)
    for off in range(0, N, RBLOCK):
        r = off + tl.arange(0, RBLOCK)
        xc = tl.load(x_ptr + row * N + r, eviction_policy="evict_last" if EV else "").to(tl.float32) - mean
        acc += xc * xc
    rstd = tl.rsqrt(tl.sum(acc, 0) / N + 1e-5)
    for off in range(0, N, RBLOCK):
        r = off + tl.arange(0, RBLOCK)
        x = tl.load(x_ptr + row * N + r, eviction_policy="evict_first" if EV else "").to(tl.float32)
        w = tl.load(w_ptr + r, eviction_policy="evict_last" if EV else "").to(tl.float32)
        b = tl.load(b_ptr + r, eviction_policy="evict_last" if EV else "").to(tl.float32)
        tl.store(o_ptr + row * N + r, ((x - mean) * rstd * w + b).to(o_ptr.dtype.element_ty))


@triton.jit
def rms_persist(x_ptr, w_ptr, o_ptr, N: tl.constexpr, XBLOCK: tl.constexpr, EVW: tl.constexpr,
                MASKED: tl.constexpr):
    row = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    r = tl.arange(0, N)[None, :]
    x = _held_row(x_ptr, row, r, N, MASKED)
    w = _weight(w_ptr, r, EVW)
    ms = tl.sum(x * x, 1)[:, None] / N
    y = (x * tl.rsqrt(ms + 1e-6)).to(o_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(o_ptr + row * N + r, y.to(o_ptr.dtype.element_ty))


def kiln_compiled(fn, args):
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=functools.partial(backend, options={"fallback": False}))
    compiled(*args)
    return compiled


def inductor_compiled(fn, args, tag):
    torch._dynamo.reset()
    compiled = torch.compile(fn)
    _, codes = run_and_get_code(compiled, *args)
    with open(f"{OUT}/codes.txt", "a") as f:
        f.write(f"\n\n######## inductor {tag}\n" + "\n#####\n".join(codes))
    return compiled


def variants(name, x, w, b, o, rows, width):
    """{label: launch} of the hand kernels for one row."""
    found = {}
    for xblock in (1, 2):
        for warps in (4, 8, 16):
            for evw in (0, 1):
                for masked in ((0, 1) if (xblock, warps, evw) == (1, 8, 1) else (0,)):
                    grid = (rows // xblock,)
                    if name == "ln":
                        launch = functools.partial(ln_persist[grid], x, w, b, o, width, xblock, evw, masked,
                                                   num_warps=warps)
                    else:
                        launch = functools.partial(rms_persist[grid], x, w, o, width, xblock, evw, masked,
                                                   num_warps=warps)
                    found[f"held row xb{xblock} w{warps} evw{evw} m{masked}"] = launch
    if name == "ln" and width == 4096:
        for rblock in (1024, 2048, 4096):
            for warps in (4, 8, 16):
                for ev in (0, 1):
                    found[f"loop rb{rblock} w{warps} ev{ev}"] = functools.partial(
                        ln_loop[(rows,)], x, w, b, o, width, rblock, ev, num_warps=warps)
    return found


def main() -> None:
    lines = []
    for dtype_name in ("float32", "bfloat16"):
        dtype = getattr(torch, dtype_name)
        copy = copy_bandwidth(dtype)
        for width in (4096, 16384):
            rows = (1 << 26) // width
            x = torch.randn(rows, width, device="cuda", dtype=dtype)
            w, b = torch.randn(width, device="cuda", dtype=dtype), torch.randn(width, device="cuda", dtype=dtype)
            o = torch.empty_like(x)
            for name, fn, args in (("ln", layer_norm_rows, (x, w, b)), ("rms", rmsnorm_rows, (x, w))):
                moved = (x.numel() * 2 + w.numel() * len(args[1:])) * x.element_size()
                want = fn(*args)
                times = {"inductor": bench(functools.partial(inductor_compiled(fn, args, f"{name} {dtype_name} {width}"),
                                                             *args)),
                         "kiln": bench(functools.partial(kiln_compiled(fn, args), *args))}
                for label, launch in variants(name, x, w, b, o, rows, width).items():
                    launch()
                    error = float((o.float() - want.float()).abs().max())
                    times[f"{label} err{error:.0e}"] = bench(launch)
                percent = {label: 100 * moved / seconds / copy for label, seconds in times.items()}
                lines.append(f"## {name} {dtype_name} {width}: inductor {percent['inductor']:.1f} "
                             f"kiln {percent['kiln']:.1f}")
                lines += [f"   {label}: {value:.1f}" for label, value in sorted(percent.items(), key=lambda kv: -kv[1])[:8]]
                print("\n".join(lines[-9:]), flush=True)
    with open(f"{OUT}/probe.md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
