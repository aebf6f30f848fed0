"""One compile through kiln with the whole-graph cache, for ``test_integration_graph_cache.py``.

The test runs `run` (or `run_training`) in its own process (cold: the cache is filled), then
this file as a fresh process on the same cache directory (warm: the graph must come from the
cache): ``python graph_cache_runs.py CACHE_DIR OUT.pt [training]``. Both compile the same
function on the same inputs, so their Dynamo graphs and keys are equal.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import torch

from kiln.codegen_cpp._internal.runtime import CompiledKernel
from kiln.integration import GraphReport, KilnOptions
from kiln.integration._internal.backend import _compile


def workload(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.softmax(x @ w + 1, -1)
    return y.sum(0), torch.tensor([1.0, 2.0]) * torch.tanh(y[0, :2])  # a tensor constant too


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=generator), torch.randn(16, 16, generator=generator)


def _recording_backend(cache_dir: str, reports: list[GraphReport]):
    options = KilnOptions.create({"fallback": False, "cache_dir": cache_dir, "graph_cache": True})
    return lambda gm, example_inputs: _compile(gm, example_inputs, options, reports.append)


def _kernel_calls(module: torch.nn.Module) -> int:
    """How many compiled kernels the graph module calls."""
    return sum(1 for n in module.graph.nodes if n.op == "call_function" and type(n.target).__name__ == "CompiledKernel")


def run(cache_dir: str) -> dict:
    """Compile and call `workload`; returns its outputs, the graph reports, and the names of the
    compiled kernels the module calls (what runs, whether or not it came from the cache)."""
    reports: list[GraphReport] = []
    modules = []
    record = _recording_backend(cache_dir, reports)

    def backend(gm, example_inputs):
        modules.append(record(gm, example_inputs))
        return modules[-1]

    torch._dynamo.reset()
    with torch.no_grad():
        outputs = torch.compile(workload, backend=backend)(*inputs())
    return {"outputs": outputs, "reports": reports, "kernel_calls": sum(map(_kernel_calls, modules))}


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def training_step(model: torch.nn.Module, step: Callable[..., torch.Tensor], x: torch.Tensor) -> dict:
    loss = step(x)
    loss.backward()
    return {"loss": loss.detach(), "grads": [p.grad.clone() for p in model.parameters()]}


def run_training(cache_dir: str) -> dict:
    """One compiled training step of `mlp` (forward and backward); returns the loss, the
    parameters' gradients and every graph report (forward, then backward)."""
    model = mlp()
    reports: list[GraphReport] = []
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: model(x).square().mean(), backend=_recording_backend(cache_dir, reports))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    with _counting_kernel_runs() as runs:
        result = training_step(model, compiled, x)
    return {**result, "reports": reports, "kernel_runs": runs[0]}


@contextlib.contextmanager
def _counting_kernel_runs() -> Iterator[list[int]]:
    """Counts the generated C++ kernels that run (whether or not they came from the cache)."""
    runs = [0]
    original = CompiledKernel.__call__

    def counted(self, *args):
        runs[0] += 1
        return original(self, *args)

    CompiledKernel.__call__ = counted
    try:
        yield runs
    finally:
        CompiledKernel.__call__ = original


def eager_training() -> dict:
    model = mlp()
    return training_step(model, lambda x: model(x).square().mean(),
                         torch.randn(8, 16, generator=torch.Generator().manual_seed(1)))


if __name__ == "__main__":
    result = run_training(sys.argv[1]) if sys.argv[3:] == ["training"] else run(sys.argv[1])
    result["reports"] = [(r.cached, r.kernels, r.backward, tuple(s for s, _ in r.stage_seconds))
                         for r in result["reports"]]
    torch.save(result, sys.argv[2])
