"""One compile through kiln with the whole-graph cache, for ``test_integration_graph_cache.py``.

The test runs `run` (or `run_training`) in its own process (cold: the cache is filled), then
this file as a fresh process on the same cache directory (warm: the graph must come from the
cache): ``python graph_cache_runs.py CACHE_DIR OUT.pt [training] [CODEGEN]``. Both compile the
same function on the same inputs, so their Dynamo graphs and keys are equal. CODEGEN is "cpu"
(codegen_cpp, the default) or "cuda" (codegen_triton; on CPU tensors under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator

import pytest
import torch

from kiln.integration import GraphReport, KilnOptions
from kiln.integration._internal.backend import _compile


def workload(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.softmax(x @ w + 1, -1)
    return y.sum(0), torch.tensor([1.0, 2.0], device=y.device) * torch.tanh(y[0, :2])  # a tensor constant too


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return _randn(generator, 8, 16), _randn(generator, 16, 16)


def _randn(generator: torch.Generator, *size: int) -> torch.Tensor:
    """Drawn on the CPU, then moved to torch's default device (a GPU when the tests run there)."""
    return torch.randn(*size, generator=generator, device="cpu").to(torch.get_default_device())


ON_GPU = os.environ.get("KILN_INTEGRATION_TEST_DEVICE", "").startswith("cuda")  # see conftest.py
# codegen_triton ("cuda") runs on CPU tensors under Triton's interpreter, set from process start
# (nox -s tests sets it), or on a GPU, where it compiles for real.
NEEDS_TRITON = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not ON_GPU,
                                  reason="needs TRITON_INTERPRET=1 from process start (nox -s tests sets it) or a GPU")
# Each codegen's package and the type its kernel nodes call (imported when used: a warm process
# must import only what it runs).
CODEGEN_PACKAGES = {"cpu": ("kiln.codegen_cpp", "CompiledKernel"), "cuda": ("kiln.codegen_triton", "TritonKernel")}
PIPELINE = "kiln.integration._internal.pipeline"  # imported on a cache miss only: traces, lowers, generates code
# What a warm process rebuilding its graphs from the cache must not import (prefixes of module
# names): the stages that trace, decompose, partition, lower and generate code. A hit needs the
# IR records its kernels pickle (loopir's ir, ops, sizes), the codegen's runtime and the cache.
_CPP = "kiln.codegen_cpp._internal."
NEVER_ON_A_HIT = (
    "kiln.decomp", "kiln.partition", PIPELINE, "kiln.integration._internal.regions", "kiln.integration._internal.bisect",
    "kiln.integration._internal.checked",
    *(f"kiln.loopir._internal.{m}" for m in ("api", "kernel_graph", "lower", "registry", "schedule", "recompute",
                                             "evaluate", "verify", "output_views", "values")),  # "lower" covers lower_*
    *(f"{_CPP}{m}" for m in ("api", "function_source", "kernel_source", "vector_", "scan_source", "parallel_scan_source",
                             "reduction_source", "random_source", "scatter_source", "printer", "low_precision")),
    *(f"kiln.capture._internal.{m}" for m in ("capture", "dynamo_mode", "export_mode", "graph_file", "graph_codec",
                                              "fake_values", "report", "html_report", "verify")),
)
# autograd_trace's tracing: a training graph's hit still imports it (its runtime module imports the
# joint trace and the partitioner), an inference graph's does not.
TRACING = tuple(f"kiln.autograd_trace._internal.{m}" for m in (
    "inference", "joint", "partitioner", "min_cut", "interpreter", "targets", "analysis"))
MAX_KILN_MODULES_ON_A_HIT = 60  # a CPU inference hit imported 87 kiln modules before the lazy package exports, 51 after


def imported_among(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    """The modules of `modules` whose names start with one of `prefixes`."""
    return [m for m in modules if m.startswith(prefixes)]


def kernel_type(codegen: str) -> type:
    package, name = CODEGEN_PACKAGES[codegen]
    return getattr(importlib.import_module(f"{package}._internal.runtime"), name)


def _recording_backend(cache_dir: str, reports: list[GraphReport], codegen: str):
    options = KilnOptions.create({"fallback": False, "cache_dir": cache_dir, "graph_cache": True,
                                  "codegen": None if codegen == "cpu" else codegen})  # cpu: the default's
    return lambda gm, example_inputs: _compile(gm, example_inputs, options, reports.append)


def _kernel_calls(module: torch.nn.Module, codegen: str) -> int:
    """How many compiled kernels the graph module calls."""
    return sum(1 for n in module.graph.nodes if n.op == "call_function" and type(n.target) is kernel_type(codegen))


def run(cache_dir: str, codegen: str = "cpu") -> dict:
    """Compile and call `workload`; returns its outputs, the graph reports, and the names of the
    compiled kernels the module calls (what runs, whether or not it came from the cache)."""
    reports: list[GraphReport] = []
    modules = []
    record = _recording_backend(cache_dir, reports, codegen)

    def backend(gm, example_inputs):
        modules.append(record(gm, example_inputs))
        return modules[-1]

    torch._dynamo.reset()
    with torch.no_grad():
        outputs = torch.compile(workload, backend=backend)(*inputs())
    return {"outputs": outputs, "reports": reports, "kernel_calls": sum(_kernel_calls(m, codegen) for m in modules)}


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


def training_step(model: torch.nn.Module, step: Callable[..., torch.Tensor], x: torch.Tensor) -> dict:
    loss = step(x)
    loss.backward()
    return {"loss": loss.detach(), "grads": [p.grad.clone() for p in model.parameters()]}


def run_training(cache_dir: str, codegen: str = "cpu") -> dict:
    """One compiled training step of `mlp` (forward and backward); returns the loss, the
    parameters' gradients and every graph report (forward, then backward)."""
    model = mlp()
    reports: list[GraphReport] = []
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: model(x).square().mean(), backend=_recording_backend(cache_dir, reports, codegen))
    x = _randn(torch.Generator().manual_seed(1), 8, 16)
    with _counting_kernel_runs(kernel_type(codegen)) as runs:
        result = training_step(model, compiled, x)
    return {**result, "reports": reports, "kernel_runs": runs[0]}


@contextlib.contextmanager
def _counting_kernel_runs(kernel_type: type) -> Iterator[list[int]]:
    """Counts the generated kernels that run (whether or not they came from the cache)."""
    runs = [0]
    original = kernel_type.__call__

    def counted(self, *args):
        runs[0] += 1
        return original(self, *args)

    kernel_type.__call__ = counted
    try:
        yield runs
    finally:
        kernel_type.__call__ = original


def eager_training() -> dict:
    model = mlp()
    return training_step(model, lambda x: model(x).square().mean(),
                         _randn(torch.Generator().manual_seed(1), 8, 16))


if __name__ == "__main__":
    if ON_GPU:  # as conftest.py does
        torch.set_default_device(os.environ["KILN_INTEGRATION_TEST_DEVICE"])
    modes = sys.argv[3:]
    codegen = next((m for m in modes if m in CODEGEN_PACKAGES), "cpu")
    result = run_training(sys.argv[1], codegen) if "training" in modes else run(sys.argv[1], codegen)
    result["reports"] = [(r.cached, r.kernels, r.backward, tuple(s for s, _ in r.stage_seconds))
                         for r in result["reports"]]
    result["imported"] = {name: name in sys.modules for name in (PIPELINE, *(p for p, _ in CODEGEN_PACKAGES.values()))}
    result["kiln_modules"] = sorted(name for name in sys.modules if name.startswith("kiln."))
    torch.save(result, sys.argv[2])
