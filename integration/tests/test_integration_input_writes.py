"""Input mutations stored by the kernel computing the new value (`_internal/input_writes.py`,
loopir's `input_stores.py`): results against eager, and the `copy_` calls left per graph call."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.integration import backend, explain
from kiln.loopir._internal import graph_runtime, input_stores

aten = torch.ops.aten
CODEGENS = ["cpu", "cuda"]  # codegen_cpp; codegen_triton (Triton's interpreter on CPU tensors)


class CountCopies(TorchDispatchMode):
    """Counts `aten.copy_` dispatches (a separate write-back per call; a kernel launch on a GPU)."""

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is aten.copy_.default:
            self.copies += 1
        return func(*args, **(kwargs or {}))


STORED_COPIES = [0]  # copies `stored_inputs` made back into an input (see `count_stored_copies`)


@pytest.fixture(autouse=True)
def count_stored_copies(monkeypatch):
    """Counts the inputs `stored_inputs` copied into (their kernel did not write them)."""
    STORED_COPIES[0] = 0
    original = graph_runtime.stored_inputs

    def counted(tensors, written):
        STORED_COPIES[0] += sum(value is not tensor for tensor, value in zip(tensors, written))
        return original(tensors, written)

    monkeypatch.setattr(graph_runtime, "stored_inputs", counted)
    monkeypatch.setattr(input_stores, "stored_inputs", counted)


class CountingModule(torch.nn.Module):
    """A compiled graph's module, counting the `copy_` calls of each of its calls."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.copies = []

    def forward(self, *args):
        with CountCopies() as counter:
            result = self.module(*args)
        self.copies.append(counter.copies)
        return result


class Compiled:
    """A torch.compile backend: kiln without fallback, each graph's module a `CountingModule`."""

    def __init__(self, codegen):
        self.codegen = codegen
        self.modules = []

    def __call__(self, gm, example_inputs):
        module = CountingModule(backend(gm, example_inputs, options={"fallback": False, "codegen": self.codegen}))
        self.modules.append(module)
        return module

    def kernels_ran(self):
        """Whether every compiled module calls generated kernels (kiln compiled, not eager)."""
        return bool(self.modules) and all("kernel" in _code(m.module) for m in self.modules)

    def last_copies(self):
        """`copy_` calls of the last call of the (only) compiled graph. Under Triton's interpreter
        (codegen "cuda" on CPU tensors) the interpreter copies every kernel argument back itself,
        so there the count is that of the graph's own write-back nodes and copy-backs."""
        (module,) = self.modules
        if self.codegen == "cpu":
            return module.copies[-1]
        return _code(module.module).count("aten.copy_") + STORED_COPIES[0]


def _code(module):
    forward = getattr(getattr(module, "_runtime", None), "forward", module)
    return getattr(forward, "code", "")


class BatchNormRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(x))


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_norm_training_running_stats(codegen, channels_last):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, reference = BatchNormRelu(), BatchNormRelu()
    reference.load_state_dict(model.state_dict())
    compiler = Compiled(codegen)
    compiled = torch.compile(model, backend=compiler)
    for _ in range(3):
        x = torch.randn(2, 8, 4, 4)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        x_ref = x.clone().requires_grad_()
        x.requires_grad_()
        out, expected = compiled(x), reference(x_ref)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(x.grad, x_ref.grad)
    assert compiler.kernels_ran()
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(model.bn, name), getattr(reference.bn, name))
    torch.testing.assert_close(model.bn.weight.grad, reference.bn.weight.grad)
    # the three running statistics are written by kernels: no copy_ after the graph (it was 3)
    assert compiler.last_copies() == 0


@pytest.mark.parametrize("codegen", CODEGENS)
def test_batch_norm_training_under_no_grad(codegen):
    torch._dynamo.reset()
    model, reference = BatchNormRelu(), BatchNormRelu()
    reference.load_state_dict(model.state_dict())
    compiler = Compiled(codegen)
    compiled = torch.compile(model, backend=compiler)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 8, 4, 4)
            torch.testing.assert_close(compiled(x), reference(x))
        assert compiler.last_copies() == 0
    assert compiler.kernels_ran()
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(model.bn, name), getattr(reference.bn, name))


def _run_twice(fn, make_args, codegen):
    """Eager and kiln on equal fresh arguments, twice; returns kiln's compiler and its arguments."""
    compiler = Compiled(codegen)
    compiled = torch.compile(fn, backend=compiler)
    for _ in range(2):
        args = make_args()
        expected_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        expected = fn(*expected_args)
        torch.testing.assert_close(compiled(*args), expected)
        for got, want in zip(args, expected_args):
            torch.testing.assert_close(got, want)
    assert compiler.kernels_ran()
    return compiled, compiler


def add_one_in_place(x):
    x.add_(1)
    return x


@pytest.mark.parametrize("codegen", CODEGENS)
def test_in_place_add_on_input_returned(codegen):
    torch._dynamo.reset()
    compiled, compiler = _run_twice(add_one_in_place, lambda: [torch.randn(4, 8)], codegen)
    x = torch.randn(4, 8)
    before = x.clone()
    assert compiled(x) is x
    torch.testing.assert_close(x, before + 1)
    assert compiler.last_copies() == 0


def mutated_then_read(x, w):
    x.mul_(2)
    return torch.mm(x, w), x.sum(0)


def old_value_read_after(x):
    old = x * 3
    x.add_(1)
    return old.flip(0) + x.sum()


def _slice(x):
    return x[:, 2:6]


@pytest.mark.parametrize("codegen", CODEGENS)
def test_mutated_input_read_after_the_mutation(codegen):
    torch._dynamo.reset()
    _run_twice(mutated_then_read, lambda: [torch.randn(4, 8), torch.randn(8, 3)], codegen)
    torch._dynamo.reset()
    _run_twice(old_value_read_after, lambda: [torch.randn(4, 8)], codegen)


def compiled_with(fn, codegen):
    """(`fn` compiled by kiln afresh, its `Compiled` backend)."""
    torch._dynamo.reset()
    compiler = Compiled(codegen)
    return torch.compile(fn, backend=compiler), compiler


@pytest.mark.parametrize("codegen", CODEGENS)
def test_mutated_input_that_views_a_bigger_tensor(codegen):
    compiled, compiler = compiled_with(add_one_in_place, codegen)
    for _ in range(2):
        base = torch.randn(4, 8)
        expected = base.clone()
        compiled(_slice(base))
        add_one_in_place(_slice(expected))
        torch.testing.assert_close(base, expected)  # the slice written, the rest unchanged
    assert compiler.kernels_ran()


def mutate_first_read_second(a, b):
    a.mul_(2)
    return b + 1


def test_mutated_input_aliasing_another_input():
    """Two views of one tensor, one mutated: the functional graph would read the other's old
    values, so kiln refuses it (eager fallback: correct results, said in the report)."""
    torch._dynamo.reset()
    base = torch.randn(5, 4)
    expected_base = base.clone()
    with pytest.raises(Exception, match="shares memory"):
        torch.compile(mutate_first_read_second, backend=Compiled("cpu"))(base[1:], base[:-1])
    torch._dynamo.reset()
    report = explain(mutate_first_read_second, base[1:], base[:-1])
    assert "shares memory" in str(report)
    expected = mutate_first_read_second(expected_base[1:], expected_base[:-1])
    torch.testing.assert_close(base, expected_base)  # explain ran it once, eagerly
    torch._dynamo.reset()
    out = torch.compile(mutate_first_read_second, backend="kiln")(base[1:], base[:-1])
    expected = mutate_first_read_second(expected_base[1:], expected_base[:-1])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(base, expected_base)


def mutated_and_saved(x, w):
    x.add_(1)
    return (x * w).sum()


@pytest.mark.parametrize("codegen", CODEGENS)
def test_training_graph_mutating_an_input_its_backward_reads(codegen):
    """The new value is saved for the backward too: its write-back stays a copy in the graph."""
    compiled, compiler = compiled_with(mutated_and_saved, codegen)
    for _ in range(2):
        x, w = torch.randn(4, 8), torch.randn(4, 8, requires_grad=True)
        x_ref, w_ref = x.clone(), w.detach().clone().requires_grad_()
        compiled(x, w).backward()
        mutated_and_saved(x_ref, w_ref).backward()
        torch.testing.assert_close(x, x_ref)
        torch.testing.assert_close(w.grad, w_ref.grad)
    assert compiler.kernels_ran()


def test_in_place_add_under_inference_mode():
    compiled, compiler = compiled_with(add_one_in_place, "cpu")
    with torch.inference_mode():
        for _ in range(2):
            x = torch.randn(4, 8)
            expected = x + 1
            assert compiled(x) is x
            torch.testing.assert_close(x, expected)
    assert compiler.kernels_ran() and compiler.last_copies() == 0


def scale_rows_in_place(x, scale):
    x.mul_(scale)
    return scale * 2


def test_dynamic_shapes_input_written_in_place():
    compiled, compiler = compiled_with(scale_rows_in_place, "cpu")
    for rows in (3, 5, 7):
        x, scale = torch.randn(rows, 6), torch.randn(6)
        expected_x = x.clone()
        expected = scale_rows_in_place(expected_x, scale)
        torch.testing.assert_close(compiled(x, scale), expected)
        torch.testing.assert_close(x, expected_x)
    assert compiler.kernels_ran() and compiler.modules[-1].copies[-1] == 0
