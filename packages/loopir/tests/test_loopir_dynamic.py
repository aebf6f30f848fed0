"""Dynamic shapes: graphs traced symbolically lower once and run at several sizes."""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, verify

aten = torch.ops.aten
SIZES = [(3, 4), (5, 7), (2, 9), (6, 2)]


def lower_symbolic(fn, *example):
    gm = make_fx(fn, tracing_mode="symbolic")(*example)
    kg = lower(gm)
    verify(kg)
    return kg


def run_at_sizes(kg, fn, make_args, sizes=SIZES):
    for size in sizes:
        args = make_args(*size)
        torch.testing.assert_close(kg(*args), fn(*args), equal_nan=True, msg=lambda m, s=size: f"{s}: {m}")


def test_pointwise_reads_sizes_at_run_time():
    def fn(x, y):
        return x * torch.sigmoid(x) + torch.tanh(y)

    kg = lower_symbolic(fn, torch.randn(3, 4), torch.randn(4))
    (kernel,) = kg.kernels
    assert kernel.symbols and all(isinstance(s, sympy.Symbol) for s in kernel.symbols)
    assert not any(isinstance(r, sympy.Integer) for r in kernel.ranges)
    targets = [n.target for n in kg.gm.graph.nodes]
    assert aten.sym_size.int in targets
    run_at_sizes(kg, fn, lambda m, n: (torch.randn(m, n), torch.randn(n)))


@pytest.mark.parametrize("fn", [
    lambda x: x.sum(-1),
    lambda x: x.sum(),
    lambda x: x.mean(0, keepdim=True) * 2,
    lambda x: x.amax(-1, keepdim=True) - x.amin(0).sum(),
    lambda x: (x - x.amax(-1, keepdim=True)).exp() / (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True),
], ids=["sum", "sum-all", "mean", "amax-amin", "softmax"])
def test_reductions(fn):
    kg = lower_symbolic(fn, torch.randn(3, 4))
    run_at_sizes(kg, fn, lambda m, n: (torch.randn(m, n),))


@pytest.mark.parametrize("fn", [
    lambda x: x.t() * 2,
    lambda x: x.t(),
    lambda x: x.reshape(-1) + 1,
    lambda x: x.t().reshape(-1) * 2,
    lambda x: x[1:, ::2] + 1,
    lambda x: x[:, -2:] * 3,
    lambda x: x[:, -2:],
    lambda x: x[-1] + x[:, 0].sum(),
    lambda x: x.unsqueeze(1).expand(-1, 3, -1) * 2,
    lambda x: (x * 2).t().reshape(x.shape[1], x.shape[0]) + 1,
], ids=["t", "t-output", "reshape", "reshape-noncontig", "slice", "slice-neg", "slice-neg-output",
        "select", "expand", "view-of-lazy"])
def test_views(fn):
    kg = lower_symbolic(fn, torch.randn(5, 6))
    run_at_sizes(kg, fn, lambda m, n: (torch.randn(m, n),), sizes=[(5, 6), (4, 3), (7, 2)])


def test_size_arithmetic_in_graph():
    def fn(x):
        return x * x.shape[0] + x.shape[0] * x.shape[1] - x.numel() // 2

    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(3, 4))
    assert any(n.target == aten.sym_size.int for n in gm.graph.nodes)
    kg = lower(gm)
    verify(kg)
    run_at_sizes(kg, fn, lambda m, n: (torch.randn(m, n),))


def test_symint_placeholder():
    def fn(x, n):
        return x * n + x.sum(-1, keepdim=True)

    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(3, 4), 5)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert isinstance(placeholders[1].meta["val"], torch.SymInt)
    kg = lower(gm)
    verify(kg)
    for (m, k), n in zip(SIZES, (5, -2, 7, 0)):
        x = torch.randn(m, k)
        torch.testing.assert_close(kg(x, n), fn(x, n))


def test_symint_placeholder_as_size():
    def fn(x, n):
        return x.view(n, -1) * 2

    kg = lower_symbolic(fn, torch.randn(12), 3)
    for numel, n in ((12, 3), (20, 4), (6, 6)):
        x = torch.randn(numel)
        torch.testing.assert_close(kg(x, n), fn(x, n))


def test_extern_with_symbolic_sizes():
    def fn(a, b):
        return torch.relu(a.t() @ b) + 1

    kg = lower_symbolic(fn, torch.randn(5, 3), torch.randn(5, 4))
    assert len(kg.externs) == 1
    for m, k, n in ((5, 3, 4), (2, 7, 3), (6, 1, 8)):
        a, b = torch.randn(m, k), torch.randn(m, n)
        torch.testing.assert_close(kg(a, b), fn(a, b))


def test_kernel_called_directly_with_symbol_values():
    gm = make_fx(lambda x: x.t() + 1, tracing_mode="symbolic")(torch.randn(3, 4))
    kg = lower(gm)
    (kernel,) = kg.kernels
    call = next(n for n in kg.gm.graph.nodes if n.target is kernel)
    assert len(call.args) == len(kernel.inputs) + len(kernel.symbols)
    fake = next(iter(gm.graph.nodes)).meta["val"]
    x = torch.randn(5, 6)
    value_of = {size.node.expr: real for size, real in zip(fake.shape, x.shape)}
    (out,) = kernel(x, *[value_of[s] for s in kernel.symbols])
    # eager's x.t() + 1 is transposed: the kernel computes it in memory order, so its buffer
    # is the transpose, which the kernel graph views back
    torch.testing.assert_close(out, (x.t() + 1).t())
    torch.testing.assert_close(kg(x), x.t() + 1)
    with pytest.raises(TypeError, match="takes 1 tensors and 2 sizes"):
        kernel(x)


def test_input_with_another_layout_is_copied_not_misread():
    """Loads use the traced strides: the kernel graph copies a graph input of another layout
    into the traced one (ensure_layout); a kernel called directly refuses it."""
    kg = lower_symbolic(lambda x: x * 2, torch.randn(4, 6))
    x = torch.randn(8, 16)[:3, :5]
    torch.testing.assert_close(kg(x), x * 2)
    torch.testing.assert_close(kg(x.contiguous()), x * 2)
    (kernel,) = kg.kernels
    with pytest.raises(ValueError, match=r"input x_1 dim 0 has size 3 and stride 16, the kernel was built for 3 and 5"):
        kernel(x, 3, 5)


def test_layout_guard_feeds_views_given_to_externs():
    """A view handed to an extern is built from traced strides, so it too must see the traced layout."""
    gm = make_fx(lambda a, b: torch.mm(a.t(), b) + 1)(torch.randn(5, 4), torch.randn(5, 3))
    kg = lower(gm)
    a = torch.randn(5, 8)[:, ::2]  # another layout than traced
    b = torch.randn(5, 3)
    torch.testing.assert_close(kg(a, b), torch.mm(a.t(), b) + 1)


def test_size_symbols_are_read_from_sizes_before_strides():
    kg = lower_symbolic(lambda x: x.sum(-1), torch.randn(4, 6))
    reads = [(n.target, n.args[1]) for n in kg.gm.graph.nodes if n.op == "call_function"
             and n.target in (aten.sym_size.int, aten.sym_stride.int)]
    assert sorted(reads, key=lambda r: r[1]) == [(aten.sym_size.int, 0), (aten.sym_size.int, 1)]


def test_input_traced_expanded_and_given_materialized_is_expanded_again():
    """An input traced with a stride of 0 (an expanded tensor) but given with its elements laid
    out (as an eager op between regions may return it) is re-expanded, not copied into
    overlapping memory (which torch refuses)."""
    row = torch.randn(1, 6)
    gm = make_fx(lambda x: x * 2)(row.expand(4, 6))
    kg = lower(gm)
    assert list(kg.kernels[0].inputs[0].stride) == [0, 1]
    given = row.expand(4, 6).contiguous()
    torch.testing.assert_close(kg(given), given * 2)
