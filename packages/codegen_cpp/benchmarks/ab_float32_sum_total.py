"""A/B timing of a float32 row sum's total: float32 lanes on short rows (the default) against
the float64 total everywhere (what kiln generated before; `SHORT_ROW = 0` forces it).

Both variants of each workload are generated and built in this process (kiln.codegen_cpp,
vector code, the options kiln's backend lowers with), then their kernels are called through
ctypes on the same preallocated inputs and outputs, interleaved: round after round, each
variant timed for `--calls` calls (median of `--repeat` samples per round). The outputs of the
two are compared as well. Run from the repository root:

    python packages/codegen_cpp/benchmarks/ab_float32_sum_total.py --rounds 6

with PYTHONPATH naming the packages' src directories. The machine being shared, compare the
per-round ratios, not single figures.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, decomp, loopir
from kiln.codegen_cpp._internal import vector_reduction_source


def rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b)


WORKLOADS: dict[str, Callable[..., torch.Tensor]] = {"rmsnorm": rmsnorm, "layer_norm": layer_norm}
SHAPES = [(4096, 1024), (1024, 4096), (256, 16384)]


class Variant:
    """One build of a workload: its kernel (one C function) and the arguments to call it with."""

    def __init__(self, fn: Callable[..., torch.Tensor], args: tuple[torch.Tensor, ...], out: torch.Tensor,
                 short_row: int, cache: str) -> None:
        saved = vector_reduction_source.SHORT_ROW
        vector_reduction_source.SHORT_ROW = short_row
        try:
            gm = make_fx(fn, decomposition_table=dict(decomp.loop_level()))(*args)
            kernel_graph = loopir.lower(gm, row_temporaries=True, recompute_cheap=True)
            module = codegen_cpp.compile(kernel_graph, codegen_cpp.CppOptions(cache_dir=cache, vectorize=True))
        finally:
            vector_reduction_source.SHORT_ROW = saved
        artifacts = module.meta["kiln_cpp"]
        self.source = artifacts.source
        signatures = re.findall(r'extern "C" void (kernel\d+)\(([^)]*)\)', self.source)
        assert len(signatures) == 1, f"expected one kernel, got {[s[0] for s in signatures]}"
        name, params = signatures[0]
        inputs = {f"in_{p.name}": a for p, a in zip(gm.graph.find_nodes(op="placeholder"), args)}
        pointers = []
        for param in params.split(","):
            pname = param.split()[-1]
            if pname in inputs:
                pointers.append(inputs[pname].data_ptr())
            else:  # one output per row kernel here (the normalized rows), the same for both variants
                pointers.append(out.data_ptr())
        self.kernel = getattr(ctypes.CDLL(str(artifacts.library_path)), name)
        self.kernel.restype = None
        self.args = [ctypes.c_void_p(p) for p in pointers]

    def time(self, calls: int) -> float:
        """Milliseconds per call over `calls` calls."""
        start = time.perf_counter()
        for _ in range(calls):
            self.kernel(*self.args)
        return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=5, help="samples per variant per round (median)")
    parser.add_argument("--calls", type=int, default=20, help="kernel calls per sample")
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    parser.add_argument("--shapes", nargs="*", default=[f"{r}x{c}" for r, c in SHAPES],
                        help="ROWSxCOLS (e.g. 64x1024: rows that stay in cache, the per-row cost alone)")
    args = parser.parse_args()
    cache = tempfile.mkdtemp(prefix="kiln_ab_sum_")
    print(f"torch threads {torch.get_num_threads()}; medians of {args.repeat} x {args.calls} calls per round; "
          f"new = float32 total on short rows, old = float64 total; ratio = new / old")
    for name in args.workloads:
        for rows, cols in (tuple(map(int, shape.split("x"))) for shape in args.shapes):
            torch.manual_seed(0)
            x, w, b = torch.randn(rows, cols), torch.randn(cols), torch.randn(cols)
            inputs = (x, w) if name == "rmsnorm" else (x, w, b)
            out = torch.empty_like(x)
            new = Variant(WORKLOADS[name], inputs, out, vector_reduction_source.SHORT_ROW, cache)
            old = Variant(WORKLOADS[name], inputs, out, 0, cache)
            assert "kiln::sum_total<" not in old.source
            # a long row: the same code twice, an A/A control of the harness
            total = "float32 total" if "kiln::sum_total<" in new.source else "A/A: same code"
            expected = WORKLOADS[name](*inputs)
            err = []
            for variant in (new, old):  # warm up (pages touched, threads started), and check
                variant.time(args.calls)
                err.append(float((out - expected).abs().max()))
            medians: dict[str, list[float]] = {"new": [], "old": []}
            fastest = {"new": float("inf"), "old": float("inf")}
            for round_ in range(args.rounds):
                order = (("new", new), ("old", old)) if round_ % 2 == 0 else (("old", old), ("new", new))
                samples: dict[str, list[float]] = {"new": [], "old": []}
                for _ in range(args.repeat):
                    for key, variant in order:
                        samples[key].append(variant.time(args.calls))
                for key in samples:
                    medians[key].append(statistics.median(samples[key]))
                    fastest[key] = min(fastest[key], *samples[key])
            ratios = [a / b for a, b in zip(medians["new"], medians["old"])]
            print(f"{name} {rows}x{cols} [{total}]: new {' '.join(f'{m:.3f}' for m in medians['new'])} ms | old "
                  f"{' '.join(f'{m:.3f}' for m in medians['old'])} ms | ratio of medians: median "
                  f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
                  f"{sum(r < 1 for r in ratios)}/{len(ratios)} rounds < 1) | fastest {fastest['new']:.3f} / "
                  f"{fastest['old']:.3f} ms = {fastest['new'] / fastest['old']:.3f} | max err {err[0]:.1e} / "
                  f"{err[1]:.1e}", flush=True)

if __name__ == "__main__":
    main()
