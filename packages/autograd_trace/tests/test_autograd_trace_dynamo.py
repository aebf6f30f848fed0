"""trace_inference called from inside a Dynamo backend (symbolic sizes, Dynamo's fake mode)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch._dynamo
import torch.fx

from kiln.autograd_trace import TraceError, trace_inference, verify

aten = torch.ops.aten


class RecordingBackend:
    """A Dynamo backend that traces each graph with trace_inference and runs the result."""

    def __init__(self, decompositions: dict | None = None) -> None:
        self.decompositions = decompositions
        self.inputs: list[torch.fx.GraphModule] = []
        self.outputs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        traced = trace_inference(gm, example_inputs, decompositions=self.decompositions)
        verify(traced)
        self.inputs.append(gm)
        self.outputs.append(traced)
        return traced


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def test_dynamic_shapes_give_symint_meta_and_same_calling_convention() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x.view(x.shape[0], -1) * 2).sum(-1) + y.shape[0]

    backend = RecordingBackend()
    compiled = torch.compile(f, backend=backend, dynamic=True)
    x, y = torch.randn(3, 2, 4), torch.randn(5)

    torch.testing.assert_close(compiled(x, y), f(x, y))

    assert len(backend.outputs) == 1
    source, traced = backend.inputs[0], backend.outputs[0]
    assert [p.name for p in placeholders(traced)] == [p.name for p in placeholders(source)]
    tensor_input = next(p for p in placeholders(traced) if isinstance(p.meta["val"], torch.Tensor))
    assert all(isinstance(s, torch.SymInt) for s in tensor_input.meta["val"].shape)
    symint_inputs = [p for p in placeholders(traced) if isinstance(p.meta["val"], torch.SymInt)]
    assert symint_inputs, "Dynamo passes sizes as SymInt placeholders with dynamic=True"
    sum_node = next(n for n in traced.graph.nodes if n.target is aten.sum.dim_IntList)
    assert isinstance(sum_node.meta["val"].shape[0], torch.SymInt)
    assert all(
        isinstance(n.target, torch._ops.OpOverload)
        for n in traced.graph.nodes
        if n.op == "call_function" and n.target is not aten.sym_size.int
    )

    x2, y2 = torch.randn(6, 3, 2), torch.randn(2)
    torch.testing.assert_close(compiled(x2, y2), f(x2, y2))
    assert len(backend.outputs) == 1, "dynamic=True should not recompile for new sizes"


def test_stack_trace_and_module_stack_are_kept() -> None:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.proj(x))

    model = Block()
    backend = RecordingBackend()
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x))

    assert backend.outputs
    traced = backend.outputs[0]
    relu = next(n for n in traced.graph.nodes if n.target is aten.relu.default)
    assert "torch.relu(self.proj(x))" in relu.meta["stack_trace"]
    addmm = next(n for n in traced.graph.nodes if n.target is aten.addmm.default)
    assert any("proj" in path for path, _ in addmm.meta["nn_module_stack"].values())


def test_input_mutation_in_a_dynamo_graph() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        y.mul_(2)
        return torch.where(x > 0, x, -x) + y.sum()

    backend = RecordingBackend()
    x, y = torch.randn(3, 4), torch.ones(4)
    out = torch.compile(f, backend=backend, dynamic=True)(x, y)

    assert backend.outputs
    traced = backend.outputs[0]
    copies = [n for n in traced.graph.nodes if n.target is aten.copy_.default]
    assert len(copies) == 1 and copies[0].args[0].op == "placeholder"
    torch.testing.assert_close(y, torch.full((4,), 2.0))
    torch.testing.assert_close(out, torch.where(x > 0, x, -x) + 8.0)


def test_batch_norm_training_in_a_dynamo_graph() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    reference = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    reference.load_state_dict(model.state_dict())
    backend = RecordingBackend()
    x = torch.randn(8, 3)

    with torch.no_grad():
        out = torch.compile(model, backend=backend)(x)
        expected = reference(x)

    assert backend.outputs
    targets = [n.target for n in backend.outputs[0].graph.nodes]
    assert aten._native_batch_norm_legit_functional.default in targets
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)
    torch.testing.assert_close(model[1].running_var, reference[1].running_var)


def test_trace_error_inside_backend_names_node_and_source_line() -> None:
    def failing_relu(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("decomposition exploded")

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2)

    backend = RecordingBackend(decompositions={aten.relu.default: failing_relu})
    with pytest.raises(Exception) as info:  # Dynamo wraps backend errors
        torch.compile(f, backend=backend)(torch.randn(3))

    error = info.value
    while error is not None and not isinstance(error, TraceError):
        error = error.__cause__ or getattr(error, "inner_exception", None)
    assert isinstance(error, TraceError), f"no TraceError in the chain of {info.value!r}"
    message = str(error)
    assert "torch.relu" in message
    assert "return torch.relu(x * 2)" in message
    assert "decomposition exploded" in message
    assert isinstance(error.__cause__, ValueError)


def test_decompositions_inside_backend() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(x) * 3

    backend = RecordingBackend(decompositions=torch._decomp.core_aten_decompositions())
    x = torch.randn(5)
    torch.testing.assert_close(torch.compile(f, backend=backend, dynamic=True)(x), f(x))

    assert backend.outputs
    targets = [n.target for n in backend.outputs[0].graph.nodes]
    assert aten.silu.default not in targets
    assert aten.sigmoid.default in targets
