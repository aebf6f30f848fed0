"""aot_compile under compiled autograd, and collectives in traced graphs."""

from __future__ import annotations

import torch
import torch.fx

from kiln.autograd_trace import aot_compile, trace_inference


class Recorded:
    """An eager compiler that records the graphs it was given."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[object]):
        self.graphs.append(gm)
        return gm


def mlp(x, w1, w2):
    return (torch.tanh(x @ w1) @ w2).square().sum()


def leaves(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 8, generator=g), torch.randn(8, 16, generator=g, requires_grad=True),
            torch.randn(16, 2, generator=g, requires_grad=True)]


def test_compiled_autograd_inlines_the_aten_backward_graph_instead_of_compiling_it():
    """Dynamo traces the whole backward pass: the function's backward hands it the traced ATen
    graph (never the backward compiler), and the forward traced inside the compiled-autograd
    region is traced by the eager autograd engine (no constants captured from its fake tensors)."""
    backward_compiler, autograd_graphs = Recorded(), Recorded()
    inputs = leaves()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend=autograd_graphs)):
        compiled = aot_compile(mlp, inputs, fw_compiler=Recorded(), bw_compiler=backward_compiler)
        compiled(*inputs).backward()
    reference = leaves()
    for leaf, want in zip(inputs[1:], torch.autograd.grad(mlp(*reference), reference[1:])):
        torch.testing.assert_close(leaf.grad, want)
    assert backward_compiler.graphs == []
    (graph,) = autograd_graphs.graphs
    targets = {n.target for n in graph.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.tanh_backward.default in targets
    assert not [n for n in graph.graph.nodes if n.op == "get_attr"]


def test_backward_compiles_as_usual_outside_compiled_autograd():
    backward_compiler = Recorded()
    inputs = leaves()
    aot_compile(mlp, inputs, fw_compiler=Recorded(), bw_compiler=backward_compiler)(*inputs).backward()
    assert len(backward_compiler.graphs) == 1


def test_trace_inference_keeps_an_unused_collective():
    def fn(x):
        torch.ops._c10d_functional.all_reduce(x, "sum", "0")  # issued on every rank, result unused
        return x + 1

    gm = torch.fx.symbolic_trace(fn)
    traced = trace_inference(gm, [torch.randn(4)])
    targets = [n.target for n in traced.graph.nodes if n.op == "call_function"]
    assert torch.ops._c10d_functional.all_reduce.default in targets


def test_a_backward_called_after_a_graph_break_is_not_traced_by_dynamo_again():
    """``loss.backward()`` inside a compiled function, after a graph break, runs with Dynamo's
    frame hook set: Dynamo traced the runtime's backward, ATen graph and all, into a graph of
    its own and handed it to the backend again (as it never does torch's AOTAutograd runtime)."""
    dynamo_graphs, backward_compiler = Recorded(), Recorded()

    def backend(gm, example_inputs):
        dynamo_graphs(gm, example_inputs)
        return aot_compile(gm, example_inputs, fw_compiler=Recorded(), bw_compiler=backward_compiler)

    inputs = leaves()

    def step(x, w1, w2):
        loss = mlp(x, w1, w2)
        torch._dynamo.graph_break()
        loss.backward()
        return loss

    torch._dynamo.reset()
    torch.compile(step, backend=backend)(*inputs)
    reference = leaves()
    for leaf, want in zip(inputs[1:], torch.autograd.grad(mlp(*reference), reference[1:])):
        torch.testing.assert_close(leaf.grad, want)
    assert len(dynamo_graphs.graphs) == 1  # the forward; the backward ran compiled, untraced
    assert len(backward_compiler.graphs) == 1
