"""`nox -s demo`: compile a small model with backend="kiln" on CPU and print a comparison table."""

from __future__ import annotations

import functools
import sys
import tempfile

import torch
from workloads import CountingBackend, GatedMLP, compile_and_time, max_error, median_seconds, table

from kiln.integration import backend as kiln_backend
from kiln.integration import explain


def main() -> int:
    torch.manual_seed(0)
    model = GatedMLP().eval()
    x = torch.randn(256, 512)
    with torch.no_grad():
        report = explain(model, x)
        print(report)
        eager_out = model(x)
        eager = median_seconds(lambda: model(x))
        # A fresh code cache, so the compile time includes building the C++ (explain built it once).
        fresh_cache = tempfile.mkdtemp(prefix="kiln-demo-")
        counting = CountingBackend(functools.partial(kiln_backend, options={"cache_dir": fresh_cache}))
        compiled, first_call, _ = compile_and_time(model, (x,), counting)
        kiln = median_seconds(lambda: compiled(x))
        error = max_error(compiled(x), eager_out)
    if counting.calls == 0:
        print("error: the kiln backend was never called", file=sys.stderr)
        return 1
    print()
    print(table(
        ["model", "eager ms", "kiln ms", "speedup vs eager", "compile s", "max error", "kernels", "eager fallbacks"],
        [["GatedMLP 256x512 (linear, gate, linear, softmax)", f"{eager * 1e3:.3f}", f"{kiln * 1e3:.3f}",
          f"{eager / kiln:.2f}x", f"{first_call:.2f}", f"{error:.2e}", str(report.kernel_count),
          str(len(report.fallback_nodes))]]))
    return 0 if error < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
