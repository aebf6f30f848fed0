"""One compile through kiln with the whole-graph cache, for ``test_integration_graph_cache.py``.

The test runs `run` in its own process (cold: the cache is filled), then this file as a fresh
process on the same cache directory (warm: the graph must come from the cache):
``python graph_cache_runs.py CACHE_DIR OUT.pt``. Both compile the same function on the same
inputs, so their Dynamo graphs and keys are equal.
"""

from __future__ import annotations

import sys

import torch

from kiln.integration import GraphReport, KilnOptions
from kiln.integration._internal.backend import _compile


def workload(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.softmax(x @ w + 1, -1)
    return y.sum(0), torch.tensor([1.0, 2.0]) * torch.tanh(y[0, :2])  # a tensor constant too


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=generator), torch.randn(16, 16, generator=generator)


def run(cache_dir: str) -> dict:
    """Compile and call `workload`; returns its outputs, the graph reports, and the names of the
    compiled kernels the module calls (what runs, whether or not it came from the cache)."""
    options = KilnOptions.create({"fallback": False, "cache_dir": cache_dir, "graph_cache": True})
    reports: list[GraphReport] = []
    modules = []

    def backend(gm, example_inputs):
        module = _compile(gm, example_inputs, options, reports.append)
        modules.append(module)
        return module

    torch._dynamo.reset()
    with torch.no_grad():
        outputs = torch.compile(workload, backend=backend)(*inputs())
    kernels = [type(n.target).__name__ for m in modules for n in m.graph.nodes if n.op == "call_function"]
    return {"outputs": outputs, "reports": reports, "kernel_calls": kernels.count("CompiledKernel")}


if __name__ == "__main__":
    result = run(sys.argv[1])
    result["reports"] = [(r.cached, r.kernels, tuple(s for s, _ in r.stage_seconds)) for r in result["reports"]]
    torch.save(result, sys.argv[2])
