"""Host microseconds of one kiln kernel launch, layer by layer, against torch's launcher and Inductor.

    python tools/launch_cost.py   # on a GPU

Compiles `x * 2 + 1` (4096 floats, one Triton kernel) with kiln and Inductor, then times 2000
enqueues (median of 9 runs, no sync inside) of: the whole compiled function (Dynamo's guard, the
wrapper, the kernel), kiln's `TritonKernel.__call__`, its one-frame fast launch, torch's C++ launcher
alone with a preallocated output and with an `empty_strided`, and the pieces of the fast launch's
checks.
"""

from __future__ import annotations

import functools
import gc
import statistics
import time

import torch

from kiln.integration import backend as kiln_backend


def microseconds(fn, n: int = 2000) -> float:
    torch.cuda.synchronize()
    runs = []
    for _ in range(9):
        start = time.perf_counter_ns()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter_ns() - start) / n / 1e3)
        torch.cuda.synchronize()
    return statistics.median(runs)


def main() -> None:
    x = torch.randn(4096, device="cuda")

    def f(x):
        return x * 2 + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=functools.partial(kiln_backend, options={"fallback": False, "graph_cache": False}))
    with torch.no_grad():
        for _ in range(5):
            compiled(x)
        (kernel,) = [o for o in gc.get_objects() if type(o).__name__ == "TritonKernel"]
        fast = kernel._fast
        if not fast:
            raise SystemExit("the kernel has no fast launch (an older Triton?)")
        cells = dict(zip(fast.__code__.co_freevars, (c.cell_contents for c in fast.__closure__)))
        launch, function, grid, warps, shared, letters, tail, stream_of, device = (cells[n] for n in (
            "launch_kernel", "function", "grid_x", "warps", "shared", "letters", "tail", "current_stream", "device"))
        out, stream = torch.empty_like(x), stream_of(device)
        rows = {
            "kiln compiled fn (guard + wrapper + kernel)": lambda: compiled(x),
            "TritonKernel.__call__": lambda: kernel(x),
            "fast launch": lambda: fast((x,)),
            "torch launcher, output given": lambda: launch(function, grid, 1, 1, warps, shared, letters, (x, out) + tail, stream),
            "torch launcher + empty_strided": lambda: launch(function, grid, 1, 1, warps, shared, letters,
                                                             (x, torch.empty_strided((4096,), (1,), device="cuda")) + tail, stream),
            "empty_strided": lambda: torch.empty_strided((4096,), (1,), device="cuda"),
            "eager x * 2": lambda: x * 2,
            "five input checks": lambda: (x.dtype, x.get_device(), x.stride(), x.shape, x.data_ptr() % 16),
        }
        for name, fn in rows.items():
            print(f"{name:45s} {microseconds(fn):8.2f} us", flush=True)
        torch._dynamo.reset()
        inductor = torch.compile(f)
        for _ in range(5):
            inductor(x)
        print(f"{'Inductor compiled fn':45s} {microseconds(lambda: inductor(x)):8.2f} us")


if __name__ == "__main__":
    main()
