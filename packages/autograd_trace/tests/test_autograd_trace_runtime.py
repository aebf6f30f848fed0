"""aot_compile's runtime: autograd.Function stitching, mutation, aliasing, no-grad, errors."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.fx

from kiln.autograd_trace import aot_compile

STRATEGIES = ["save_all", "min_cut"]


class CountingCompiler:
    """An eager 'compiler' that records every graph it is given."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list[object]] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[object]):
        self.graphs.append(gm)
        self.example_inputs.append(example_inputs)
        return gm


def eager(gm: torch.fx.GraphModule, example_inputs: list[object]):
    return gm


def leaf(*shape: int, requires_grad: bool = True, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).requires_grad_(requires_grad)


def twin(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(t.requires_grad)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_gradients_match_eager_for_only_some_inputs_requiring_grad(strategy: str) -> None:
    def f(x, w, b):
        return torch.tanh(x @ w + b).sum(-1)

    x, w, b = leaf(4, 3, requires_grad=False), leaf(3, 5, seed=1), leaf(5, seed=2)
    compiled = aot_compile(f, [x, w, b], eager, partitioner=strategy)
    assert [i.requires_grad for i in compiled.joint.inputs] == [False, True, True]
    assert compiled.joint.grad_inputs == (1, 2)

    cw, cb = twin(w), twin(b)
    out = compiled(x, cw, cb)
    expected = f(x, w, b)
    torch.testing.assert_close(out, expected)
    out.pow(2).sum().backward()
    expected.pow(2).sum().backward()
    torch.testing.assert_close(cw.grad, w.grad)
    torch.testing.assert_close(cb.grad, b.grad)
    assert out.grad_fn is not None and "KilnCompiledFunction" in type(out.grad_fn).__name__


def test_backward_is_compiled_lazily_once_and_forward_only_path_saves_nothing() -> None:
    def f(x, w):
        return torch.sin(x * w).sum()

    fw, bw = CountingCompiler(), CountingCompiler()
    x, w = leaf(6), leaf(6, seed=1)
    compiled = aot_compile(f, [x, w], fw, bw)
    assert len(fw.graphs) == 1 and not bw.graphs, "backward must not compile before first use"
    assert all(not getattr(v, "requires_grad", False) for v in fw.example_inputs[0])

    with torch.no_grad():
        out = compiled(x, w)
    assert out.grad_fn is None and not out.requires_grad
    assert len(fw.graphs) == 2, "the no-grad call compiles the forward-only graph"
    forward_only = fw.graphs[1]
    assert len(forward_only.graph.output_node().args[0]) == compiled.joint.num_forward_outputs
    assert not bw.graphs

    compiled(x, w).backward()
    compiled(x, w).backward()
    assert len(bw.graphs) == 1, "the backward is compiled once"
    torch.testing.assert_close(w.grad, 2 * x.detach() * torch.cos(x * w).detach())


def test_calls_without_any_input_requiring_grad_take_the_forward_only_path() -> None:
    fw = CountingCompiler()
    compiled = aot_compile(lambda x: (x * 2).exp(), [leaf(3)], fw)
    out = compiled(leaf(3, requires_grad=False))
    assert not out.requires_grad
    assert len(fw.graphs) == 2


def test_input_mutation_is_applied_to_the_real_input() -> None:
    def f(x, y):
        x.add_(1)
        return (x * y).sum()

    x, y = torch.zeros(3), leaf(3)
    compiled = aot_compile(f, [x.clone(), y], eager)
    assert compiled.joint.mutated_inputs == (0,)
    out = compiled(x, y)
    torch.testing.assert_close(x, torch.ones(3))
    out.backward()
    torch.testing.assert_close(y.grad, torch.ones(3))
    code = compiled.partition.fw_gm.code
    assert "add_" not in code and "copy_" not in code


def test_mutation_of_an_input_requiring_grad_keeps_autograd_history() -> None:
    def f(a, b):
        a.mul_(b)
        return a.sin()

    base, b = leaf(4), leaf(4, seed=1)
    compiled = aot_compile(f, [twin(base) * 1, b], eager)  # a non-leaf input may be mutated
    assert compiled.joint.mutated_inputs == (0,)
    eager_base, eager_b = twin(base), twin(b)
    eager_a = eager_base * 1
    compiled_base, compiled_b = twin(base), twin(b)
    compiled_a = compiled_base * 1

    out = compiled(compiled_a, compiled_b)
    expected = f(eager_a, eager_b)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(compiled_a, eager_a)
    (out.sum() + compiled_a.sum()).backward()
    (expected.sum() + eager_a.sum()).backward()
    torch.testing.assert_close(compiled_base.grad, eager_base.grad)
    torch.testing.assert_close(compiled_b.grad, eager_b.grad)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_batch_norm_running_stats_update_in_training(strategy: str) -> None:
    model = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    reference = copy.deepcopy(model)
    x = torch.randn(3, 2, 6, 6)
    compiled = aot_compile(torch.fx.symbolic_trace(model), [x], eager, partitioner=strategy)
    mutated = [compiled.joint.inputs[i].lifted_name for i in compiled.joint.mutated_inputs]
    assert mutated == ["1.running_mean", "1.running_var", "1.num_batches_tracked"]
    for _ in range(2):
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
    for got, want in zip(model.buffers(), reference.buffers()):
        torch.testing.assert_close(got, want)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad)
    assert int(model[1].num_batches_tracked) == 2


def test_outputs_that_alias_inputs_are_real_views() -> None:
    def f(x, y):
        return x, x.t(), x[1:], y * 2

    x, y = leaf(3, 4), leaf(2)
    compiled = aot_compile(f, [x, y], eager)
    sources = [o.source for o in compiled.joint.outputs]
    assert sources == ["input", "input_view", "input_view", "forward"]
    same, transposed, sliced, doubled = compiled(x, y)
    assert same is x
    assert transposed._base is x and sliced._base is x
    torch.testing.assert_close(transposed, x.t())
    torch.testing.assert_close(sliced, x[1:])
    (transposed.sum() * 2 + sliced.sum() + doubled.sum()).backward()
    expected = torch.full((3, 4), 2.0)
    expected[1:] += 1
    torch.testing.assert_close(x.grad, expected)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_input_views_at_data_dependent_offsets_take_their_geometry_from_the_forward(
    strategy: str,
) -> None:
    def f(x, start):
        return x.narrow(0, start, 2), x.sum()

    x = leaf(5, 3)
    compiled = aot_compile(f, [x, torch.tensor(2)], eager, partitioner=strategy)
    view = compiled.joint.outputs[0]
    assert view.source == "input_view" and view.view is None and view.geometry is not None
    for start in (1, 3, -2):
        x.grad = None
        narrowed, total = compiled(x, torch.tensor(start))
        assert narrowed._base is x
        torch.testing.assert_close(narrowed, x.narrow(0, start, 2))
        ((narrowed * narrowed).sum() + total).backward()
        expected = torch.ones(5, 3)
        expected.narrow(0, start, 2).add_(2 * x.detach().narrow(0, start, 2))
        torch.testing.assert_close(x.grad, expected)
    with torch.no_grad():
        y = torch.zeros(5, 3)
        narrowed, _ = compiled(y, torch.tensor(1))
        narrowed.fill_(7.0)  # a real view: the write reaches the input
    assert y[1:3].eq(7).all() and y[0].eq(0).all() and y[3:].eq(0).all()


def test_outputs_that_alias_each_other() -> None:
    def f(x):
        h = x.exp()
        return h, h.view(-1), h

    x = leaf(2, 3)
    compiled = aot_compile(f, [x], eager)
    infos = compiled.joint.outputs
    assert infos[1].aliases == (0,) and infos[2].source == "output"
    a, b, c = compiled(x)
    assert c is a
    torch.testing.assert_close(b, x.exp().reshape(-1))
    (a.sum() + 2 * b.sum()).backward()
    torch.testing.assert_close(x.grad, 3 * x.detach().exp())


def test_mutated_input_returned_as_output_is_the_input_object() -> None:
    def f(x):
        x.mul_(3)
        return x, x.view(-1)

    x = torch.ones(2, 2)
    compiled = aot_compile(f, [x.clone()], eager)
    out, flat = compiled(x)
    assert out is x and flat._base is x
    torch.testing.assert_close(x, torch.full((2, 2), 3.0))


def test_retain_graph_allows_a_second_backward_and_double_backward_errors() -> None:
    compiled = aot_compile(lambda x: (x.sin() * x).sum(), [leaf(5)], eager)
    x = leaf(5)
    out = compiled(x)
    out.backward(retain_graph=True)
    first = x.grad.clone()
    out.backward()
    torch.testing.assert_close(x.grad, 2 * first)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()

    (grad,) = torch.autograd.grad(compiled(x), [x], create_graph=True)
    torch.testing.assert_close(grad, first)
    with pytest.raises(RuntimeError, match="double backward through an aot_compile'd function"):
        grad.sum().backward()


def test_parameters_are_read_at_call_time_and_get_gradients() -> None:
    model = torch.nn.Linear(4, 2)
    compiled = aot_compile(torch.fx.symbolic_trace(model), [torch.randn(3, 4)], eager)
    assert len(list(compiled.parameters())) == 0, "the compiled module must not own parameters"
    x = torch.randn(3, 4)
    with torch.no_grad():
        model.weight.mul_(2)
    torch.testing.assert_close(compiled(x), model(x))
    compiled(x).sum().backward()
    torch.testing.assert_close(model.weight.grad, x.sum(0).expand(2, 4))


def test_dropout_forward_and_backward_share_one_mask() -> None:
    def f(x):
        return torch.nn.functional.dropout(x, p=0.4, training=True)

    x = torch.ones(200, 100, requires_grad=True)
    for strategy in STRATEGIES:
        compiled = aot_compile(f, [x], eager, partitioner=strategy)
        out = compiled(x)
        out.backward(torch.ones_like(out))
        kept = out != 0
        torch.testing.assert_close(x.grad, kept.float() / 0.6)
        assert abs(kept.float().mean().item() - 0.6) < 0.02
        torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / 0.6))
        x.grad = None
        saved = {s.name for s in compiled.partition.saved}
        assert "native_dropout" not in compiled.partition.recomputed
        assert any(name.startswith("getitem") for name in saved), "the mask is saved"


def test_wrong_input_shapes_and_new_requires_grad_give_clear_errors() -> None:
    compiled = aot_compile(lambda x, y: x * y, [leaf(3), leaf(3, requires_grad=False)], eager)
    with pytest.raises(RuntimeError, match="input 'x' is torch.float32\\[4\\] but was traced"):
        compiled(leaf(4), leaf(3))
    with pytest.raises(RuntimeError, match="input 'y' requires grad but did not"):
        compiled(leaf(3), leaf(3))
    with pytest.raises(TypeError, match="takes 2 inputs"):
        compiled(leaf(3))


def test_custom_partitioner_and_compilers_see_fake_example_inputs() -> None:
    from kiln.autograd_trace import partition_joint

    seen = []

    def partitioner(joint):
        seen.append(joint)
        return partition_joint(joint, "min_cut", memory_budget=10**9)

    fw = CountingCompiler()
    compiled = aot_compile(lambda x: x.relu() * 2, [leaf(4)], fw, partitioner=partitioner)
    assert seen and compiled.partition.strategy == "min_cut" and compiled.partition.budget_met
    example = fw.example_inputs[0][0]
    assert isinstance(example, torch._subclasses.fake_tensor.FakeTensor)


def test_batch_norm_through_dynamo_with_dynamic_shapes() -> None:
    import torch._dynamo

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    reference = copy.deepcopy(model)
    compiled_graphs = []

    def backend(gm, example_inputs):
        compiled = aot_compile(gm, example_inputs, eager, partitioner="min_cut")
        compiled_graphs.append(compiled)
        return compiled

    torch._dynamo.reset()
    try:
        compiled_model = torch.compile(model, backend=backend, dynamic=True)
        for batch in (2, 5):  # Dynamo passes momentum/eps as 0-d tensors it .item()s
            x = torch.randn(batch, 3, 8, 8)
            compiled_model(x).sum().backward()
            reference(x).sum().backward()
    finally:
        torch._dynamo.reset()
    assert len(compiled_graphs) == 1
    for got, want in zip(model.buffers(), reference.buffers()):
        torch.testing.assert_close(got, want)
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad)


def test_output_view_of_an_input_with_bare_symbol_sizes() -> None:
    """An output that is a view of an input whose sizes are plain symbols (``x.t()`` with
    dynamic shapes: sizes ``(s1, s0)``) is rebuilt at each call's sizes."""
    import torch._dynamo

    def backend(gm, example_inputs):
        return aot_compile(gm, example_inputs, eager)

    def f(x, w):
        return (x @ w).sum(), x.t()

    torch._dynamo.reset()
    try:
        compiled = torch.compile(f, backend=backend, dynamic=True)
        for rows in (3, 5):
            x, w = leaf(rows, 4), leaf(4, 2, seed=1)
            total, view = compiled(x, w)
            assert view.shape == (4, rows) and view._base is x
            total.backward()
            torch.testing.assert_close(x.grad, w.sum(1).expand(rows, 4).detach())
    finally:
        torch._dynamo.reset()
