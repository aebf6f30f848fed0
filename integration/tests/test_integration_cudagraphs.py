"""`mode="reduce-overhead"`: inference graphs replayed as CUDA graphs, and every case that runs
without them (saying so). The recording tests need a CUDA device (the GPU machine runs them)."""

from __future__ import annotations

import logging

import pytest
import torch

from kiln.integration import backend
from kiln.integration._internal import cudagraphs

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


class Counting:
    """The kiln backend in reduce-overhead mode, keeping what it returned."""

    def __init__(self) -> None:
        self.modules = []

    def __call__(self, gm, example_inputs):
        module = backend(gm, example_inputs, mode="reduce-overhead")
        self.modules.append(module)
        return module


def _compiled(fn):
    torch._dynamo.reset()
    counting = Counting()
    return torch.compile(fn, backend=counting), counting


def _chain(x, w):
    for _ in range(4):
        x = torch.softmax(x * w + 1, -1)
    return x - x.mean(-1, keepdim=True)


def test_cpu_graphs_run_without_cuda_graphs_and_say_so(caplog):
    fn, counting = _compiled(_chain)
    x, w = torch.randn(4, 16, device="cpu"), torch.randn(16, device="cpu")
    with caplog.at_level(logging.WARNING, logger="kiln.integration"):
        torch.testing.assert_close(fn(x, w), _chain(x, w))
    assert "runs without CUDA graphs" in caplog.text
    assert not any(isinstance(m, cudagraphs.CudaGraphed) for m in counting.modules)


def test_graphs_writing_into_their_inputs_are_found():
    def writes(x, y):
        x[0] = 1
        y.add_(2)
        return x * y

    def views(x):
        x.view(-1)[:3].mul_(2)
        return x

    def pure(x):
        return (x + 1).relu_()  # in place on an intermediate only

    def first_graph(fn):
        graphs = []
        torch._dynamo.reset()
        torch.compile(fn, backend=lambda gm, ex: graphs.append(gm) or gm)(*[torch.randn(4, 4)] * fn.__code__.co_argcount)
        return graphs[0]

    for fn, expected in [(writes, True), (views, True), (pure, False)]:
        assert cudagraphs.writes_to_inputs(first_graph(fn)) == expected, fn.__name__


@GPU
def test_inference_is_recorded_once_per_layout_and_replayed():
    fn, counting = _compiled(_chain)
    w = torch.randn(256, device="cuda")
    results = []
    with torch.no_grad():
        for rows in (64, 64, 64, 64, 32, 32, 32):
            x = torch.randn(rows, 256, device="cuda")
            results.append(fn(x, w))
            torch.testing.assert_close(results[-1], _chain(x, w))
    # (Dynamo compiles the second size again, with a dynamic dim: one recording in each graph)
    graphed = [m for m in counting.modules if isinstance(m, cudagraphs.CudaGraphed)]
    assert graphed and all(m._disabled is None for m in graphed)
    assert sum(len(m._recordings) for m in graphed) == 2
    # outputs are copies: the next replay does not overwrite an earlier result
    x = torch.randn(32, 256, device="cuda")
    first = results[-1].clone()
    fn(x, w)
    assert torch.equal(results[-1], first)


@GPU
def test_a_parameter_that_moves_is_recorded_anew():
    model = torch.nn.Linear(64, 64).cuda()
    fn, counting = _compiled(model)
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fn(x), model(x))
        model.weight.data = model.weight.data * 2  # new storage
        torch.testing.assert_close(fn(x), model(x))


@GPU
def test_training_graphs_run_without_cuda_graphs(caplog):
    fn, _ = _compiled(lambda x: (x * 2).sum())
    x = torch.randn(8, device="cuda", requires_grad=True)
    with caplog.at_level(logging.WARNING, logger="kiln.integration"):
        fn(x).backward()
    assert "training graph" in caplog.text
    torch.testing.assert_close(x.grad, torch.full_like(x, 2))


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs"])
def test_max_autotune_tunes_kernels_and_only_max_autotune_replays(mode, monkeypatch, caplog, tmp_path):
    """The mode reaches the Triton codegen (a fake timer stands in for the GPU's, so the
    interpreter tunes too); max-autotune also wants CUDA graphs (CPU tensors: it runs without,
    saying so)."""
    from kiln.codegen_triton._internal import autotune

    timed = []

    def fake_timer(launch, candidate):
        launch()
        timed.append(candidate)
        return float(len(timed))

    monkeypatch.setattr(autotune, "measure_override", fake_timer)
    torch._dynamo.reset()
    modules = []

    def kiln(gm, example_inputs):
        modules.append(backend(gm, example_inputs, mode=mode, options={"codegen": "cuda", "fallback": False,
                                                                      "cache_dir": str(tmp_path)}))
        return modules[-1]

    fn = torch.compile(lambda x: torch.softmax(x * 2, -1), backend=kiln)
    x = torch.randn(4, 16)
    with caplog.at_level(logging.WARNING, logger="kiln.integration"):
        torch.testing.assert_close(fn(x), torch.softmax(x * 2, -1))
    assert modules and len(timed) >= 2  # kernels were timed: the autotune option got through
    if x.is_cuda:  # the GPU run of this suite (KILN_INTEGRATION_TEST_DEVICE=cuda): replayed
        assert isinstance(modules[-1], cudagraphs.CudaGraphed) == (mode == "max-autotune")
    else:
        assert ("runs without CUDA graphs" in caplog.text) == (mode == "max-autotune")
