"""Training with aot_compile: 3 optimizer steps compiled vs eager, both partition strategies.

Compiled and eager copies start from the same weights; each step seeds the RNG the same way,
so dropout draws the same masks (the compiled forward makes the same random calls in the same
order). Losses, parameters and buffers must match after every step.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import pathlib
import sys
from collections.abc import Callable

import pytest
import torch
import torch._dynamo
import torch.fx

from kiln.autograd_trace import aot_compile, verify

STRATEGIES = ["save_all", "min_cut"]


def eager(gm: torch.fx.GraphModule, example_inputs: list[object]):
    return gm


def load_tool(name: str):
    path = pathlib.Path(__file__).parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"autograd_trace_tool_{name}", path)
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


def train(
    model: torch.nn.Module, run: Callable[[torch.nn.Module, int], torch.Tensor], steps: int = 3
) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        loss = run(model, step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def assert_same_training(
    reference: torch.nn.Module,
    trained: torch.nn.Module,
    eager_losses: list[float],
    compiled_losses: list[float],
) -> None:
    assert all(math.isfinite(v) for v in eager_losses)
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-4, atol=1e-5)
    assert eager_losses[0] != eager_losses[-1], "training must change the loss"
    for (name, got), (_, want) in zip(
        trained.named_parameters(), reference.named_parameters(), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"parameter {name}")
    for (name, got), (_, want) in zip(
        trained.named_buffers(), reference.named_buffers(), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=f"buffer {name}")


class DynamoBackend:
    """The integration path: Dynamo graph + example inputs -> aot_compile."""

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy
        self.compiled = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[object]):
        compiled = aot_compile(gm, example_inputs, eager, partitioner=self.strategy)
        verify(compiled.joint)
        verify(compiled.partition)
        self.compiled.append(compiled)
        return compiled


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_mlp_module_compiled_directly(strategy: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32),
        torch.nn.GELU(),
        torch.nn.Linear(32, 32),
        torch.nn.Tanh(),
        torch.nn.Linear(32, 1),
    )
    reference = copy.deepcopy(model)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    compiled = aot_compile(model, [x], eager, partitioner=strategy)
    assert compiled.joint.grad_inputs == tuple(range(1, 7))

    def run_compiled(m, step):
        return torch.nn.functional.mse_loss(compiled(x), y)

    def run_eager(m, step):
        return torch.nn.functional.mse_loss(m(x), y)

    compiled_losses = train(model, run_compiled)
    eager_losses = train(reference, run_eager)
    assert_same_training(reference, model, eager_losses, compiled_losses)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_transformer_block_through_dynamo_with_dropout(strategy: str) -> None:
    tools = load_tool("activation_memory")
    torch.manual_seed(0)
    model = tools.TransformerBlock(dim=32, heads=4, hidden=64, dropout=0.1)
    reference = copy.deepcopy(model)
    x = torch.randn(2, 8, 32)
    backend = DynamoBackend(strategy)
    compiled_model = torch.compile(model, backend=backend)

    compiled_losses = train(model, lambda m, step: compiled_model(x).square().mean())
    eager_losses = train(reference, lambda m, step: m(x).square().mean())
    assert_same_training(reference, model, eager_losses, compiled_losses)
    assert len(backend.compiled) == 1
    partition = backend.compiled[0].partition
    if strategy == "min_cut":
        assert partition.recomputed, "min_cut recomputes cheap ops of the block"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_cnn_with_batch_norm_in_training_mode(strategy: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 5),
    )
    reference = copy.deepcopy(model)
    gm = torch.fx.symbolic_trace(model)
    x, labels = torch.randn(4, 3, 10, 10), torch.tensor([0, 1, 4, 2])
    compiled = aot_compile(gm, [x], eager, partitioner=strategy)
    assert len(compiled.joint.mutated_inputs) == 6, "running mean/var/count of two norms"

    def loss(logits):
        return torch.nn.functional.cross_entropy(logits, labels)

    compiled_losses = train(gm, lambda m, step: loss(compiled(x)))
    eager_losses = train(reference, lambda m, step: loss(m(x)))
    assert_same_training(reference, model, eager_losses, compiled_losses)
    assert int(model[1].num_batches_tracked) == 3


def _gpt2(transformers):
    config = transformers.GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=32,
        vocab_size=101,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_hugging_face_gpt2_from_a_small_config(strategy: str) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (package-alone environment)"
    )
    torch.manual_seed(0)
    model = _gpt2(transformers).train()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 101, (2, 12))
    backend = DynamoBackend(strategy)
    compiled_model = torch.compile(model, backend=backend)

    compiled_losses = train(model, lambda m, step: compiled_model(ids, labels=ids).loss)
    eager_losses = train(reference, lambda m, step: m(ids, labels=ids).loss)
    assert_same_training(reference, model, eager_losses, compiled_losses)
    assert backend.compiled, "Dynamo handed at least one graph to aot_compile"
    assert any(c.joint.grad_inputs for c in backend.compiled)


def test_min_cut_saves_fewer_bytes_than_save_all_on_the_transformer_block() -> None:
    tools = load_tool("activation_memory")
    torch.manual_seed(0)
    block = tools.TransformerBlock(dim=32, heads=4, hidden=128, dropout=0.1)
    x = torch.randn(2, 16, 32)
    rows = {r.strategy: r for r in tools.measure("block", block, lambda m: m(x))}
    assert rows["save_all"].graphs == rows["min_cut"].graphs == 1
    assert rows["min_cut"].saved_bytes < rows["save_all"].saved_bytes
    assert rows["min_cut"].activation_bytes < rows["save_all"].activation_bytes
    assert rows["min_cut"].recomputed > 0 and rows["save_all"].recomputed == 0
