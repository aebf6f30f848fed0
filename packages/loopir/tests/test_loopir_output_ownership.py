"""Outputs that view a kernel's buffer: no view of a buffer nothing else reads (eager's result is
no view; an autograd.Function's view output could not be modified in place), and with
`output_views=False` (training) copies of views of a buffer the graph reads again."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, verify


def _lowered(fn, *args, **options):
    kg = lower(make_fx(fn)(*args), **options)
    verify(kg)
    return kg


def test_an_output_computed_in_memory_order_owns_its_buffer():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    kg = _lowered(lambda x: (x * 2 + 1, (x - 1).transpose(0, 3)), x)
    assert "restrided_buffer" in kg.gm.code and "strided_view(" not in kg.gm.code
    for got, expected in zip(kg(x), (x * 2 + 1, (x - 1).transpose(0, 3))):
        torch.testing.assert_close(got, expected)
        assert got.stride() == expected.stride() and got._base is None


def test_a_view_of_a_buffer_read_again_is_copied_only_without_output_views():
    x = torch.randn(4, 5)

    def fn(x):
        y = x.exp()
        return y.sum(0), y.t()

    for output_views in (True, False):
        kg = _lowered(fn, x, output_views=output_views)
        summed, transposed = kg(x)
        torch.testing.assert_close(transposed, x.exp().t())
        assert transposed.stride() == (1, 5)
        assert ("copied_view" in kg.gm.code) == (not output_views)
        assert (transposed._base is None) == (not output_views)


def _kernel_count(kg) -> int:
    return sum(1 for node in kg.gm.graph.nodes if node.op == "call_function" and "kernel" in str(node.target))


def test_a_cat_of_one_stored_part_reads_it_where_it_lies_unless_the_graph_returns_it():
    """HF's key/value cache appends a step's values to an empty tensor: that cat reads the
    matmul's result in place (no copy kernel before the next matmul). Returned, or of a graph
    input, the cat is eager's fresh tensor."""
    x, w, empty, none = torch.randn(8, 6), torch.randn(6, 6), torch.randn(0, 8), torch.randn(0, 6)

    def fed_on(x, w, empty):
        v = torch.cat([empty, (x @ w).t()], 0)  # (6, 8), a transposed view of the matmul's result
        return v @ x

    kg = _lowered(fed_on, x, w, empty)
    assert _kernel_count(kg) == 0, kg.gm.code
    torch.testing.assert_close(kg(x, w, empty), fed_on(x, w, empty))

    def returned(x, w, empty):
        v = torch.cat([empty, (x @ w).t()], 0)
        return v @ x, v

    kg = _lowered(returned, x, w, empty)
    product, v = kg(x, w, empty)
    torch.testing.assert_close(v, (x @ w).t().contiguous())
    assert v.is_contiguous() and v._base is None

    out = _lowered(lambda x, empty: torch.cat([empty, x], 0) @ w, x, none)(x, none)
    torch.testing.assert_close(out, x @ w)
    kept = _lowered(lambda x, empty: torch.cat([empty, x], 0), x, none)(x, none)
    assert kept.data_ptr() != x.data_ptr()  # never the input's memory


def test_a_pad_that_only_crops_a_stored_value_reads_it_where_it_lies():
    """A padded output layer's weight gradient: the padded matmul's rows cut back to the weight's
    (`constant_pad_nd` with negative amounts). Returned, it is a tensor of its own over the
    matmul's memory (no copy kernel, in-place writes allowed); a crop of a graph input, or one
    not laid out as eager's contiguous result, is a copy."""
    g, x = torch.randn(16, 8), torch.randn(16, 12)

    def weight_grad(g, x):
        return torch.constant_pad_nd(g.t() @ x, [0, 0, 0, -3])  # (5, 12) of the (8, 12) product

    kg = _lowered(weight_grad, g, x)
    assert _kernel_count(kg) == 0, kg.gm.code
    assert "copied_view" not in kg.gm.code
    got = kg(g, x)
    torch.testing.assert_close(got, weight_grad(g, x))
    assert got.shape == (5, 12) and got.stride() == (12, 1) and got._base is None
    got.add_(1)  # its own tensor: no view error

    def last_dim(g, x):  # cut along the last dim: eager's result is contiguous, a view would not be
        return torch.constant_pad_nd(g.t() @ x, [0, -2])

    def of_input(g):
        return torch.constant_pad_nd(g, [0, 0, 0, -3]) * 1, torch.constant_pad_nd(g, [0, 0, 0, -3])

    for fn, args in [(last_dim, (g, x)), (of_input, (g,))]:
        kg = _lowered(fn, *args)
        assert _kernel_count(kg) == 1, (fn.__name__, kg.gm.code)
        for got, expected in zip(torch.utils._pytree.tree_leaves(kg(*args)), torch.utils._pytree.tree_leaves(fn(*args))):
            torch.testing.assert_close(got, expected)
            assert got.is_contiguous()
    cropped = kg(g)[1]
    cropped.add_(1)
    assert not torch.equal(cropped, g[:13])  # the input's memory was not shared


def test_a_cropped_value_read_by_a_kernel_is_a_view_in_its_loads():
    """Inside the graph the crop is read in place by the next kernel too."""
    g, x = torch.randn(16, 8), torch.randn(16, 12)

    def fn(g, x):
        return torch.constant_pad_nd(g.t() @ x, [0, 0, 0, -3]).exp()

    kg = _lowered(fn, g, x)
    assert _kernel_count(kg) == 1, kg.gm.code
    torch.testing.assert_close(kg(g, x), fn(g, x))
