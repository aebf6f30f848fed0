"""Views (strides or index functions, never copies), unusual graph inputs, and extern calls."""

from __future__ import annotations

import sympy
import torch


def test_view_of_input_is_free_and_aliases(check):
    x = torch.randn(3, 4)
    kg = check(lambda x: x.t(), x)
    assert not kg.kernels and not kg.externs
    out = kg(x)
    assert out.data_ptr() == x.data_ptr() and out.stride() == (1, 4)


def test_chained_views_of_input_become_one_strided_read(check, reads_of):
    x = torch.randn(4, 6, 5)
    kg = check(lambda x: x.permute(2, 0, 1)[1:, ::2, -2] * 2, x)
    assert len(kg.kernels) == 1
    (index,) = reads_of(kg)["x_1"]
    i0, i1 = sympy.symbols("i0 i1", integer=True, nonnegative=True)
    # permute -> [5, 4, 6] strides [1, 30, 5]; [1:] offset 1; [::2] stride 60; [-2] offset 20.
    # Eager's result is transposed like its input: the loops run in that order (i1 innermost).
    assert sympy.expand(index - (i1 + 1 + 60 * i0 + 20)) == 0


def test_slice_step_and_negative_start(check):
    x = torch.randn(5, 8)
    check(lambda x: x[:, -5::2] + 1, x)
    check(lambda x: x[-10:3] + 1, x)  # start clamped to 0
    check(lambda x: x[1:100, 7:] + 1, x)  # end and start past the size
    check(lambda x: x[:, 9:] + 1, x)  # start past the size: empty
    check(lambda x: x[1::3], x)


def test_slice_and_select_of_lazy_values(check):
    x = torch.randn(5, 8)
    kg = check(lambda x: (x * 2)[-3:, ::3].exp(), x)
    assert len(kg.kernels) == 1
    check(lambda x: (x * 2)[:, -1] + (x * 3)[-2], torch.randn(8, 8))


def test_select_negative_index(check):
    x = torch.randn(3, 4, 5)
    kg = check(lambda x: x[-1, :, -2], x)
    assert not kg.kernels
    check(lambda x: x.select(1, -4) * 2, x)


def test_expand_of_input_and_of_lazy(check):
    check(lambda x: x.expand(2, 3, 4) * 2, torch.randn(3, 1))
    check(lambda x: (x + 1).expand(2, 3, 4) * 2, torch.randn(3, 1))
    kg = check(lambda x: x.expand(3, 4), torch.randn(1, 4))  # output is a stride-0 view
    assert not kg.kernels


def test_unsqueeze_squeeze_of_buffer_and_lazy(check):
    x = torch.randn(3, 1, 4)
    check(lambda x: x.squeeze(1).unsqueeze(0).unsqueeze(-1) + 1, x)
    check(lambda x: (x + 1).squeeze().unsqueeze(1) * 2, x)


def test_view_of_non_contiguous_input_simplifies_to_strides(check, reads_of):
    """The view's index function (unflatten a flat position) simplifies with the loop ranges
    to plain strides: no division is left in the generated index."""
    x = torch.randn(4, 6)
    kg = check(lambda x: torch.ops.aten.view.default(x.t(), [6, 2, 2]) + 1, x)
    (index,) = reads_of(kg)["x_1"]
    i0, i1, i2 = sympy.symbols("i0 i1 i2", integer=True, nonnegative=True)
    # eager's result has the view's strides (1, 12, 6): the loops run in that memory order
    assert index == 12 * i0 + 6 * i1 + i2


def test_reshape_of_transposed_goes_through_clone(check):
    x = torch.randn(4, 6)
    kg = check(lambda x: x.t().reshape(-1) * 2, x)
    assert len(kg.kernels) == 1
    check(lambda x: x.t().reshape(3, 8), x)


def test_view_of_lazy_value(check):
    x = torch.randn(4, 6)
    kg = check(lambda x: (x.exp() + 1).view(2, 12).sum(-1), x)
    assert len(kg.kernels) == 1


def test_views_of_realized_buffer(check):
    def f(x):
        y = x.exp()  # two users: realized
        return y.t() + y.sum(0), y[1:].t()

    x = torch.randn(4, 4)
    kg = check(f, x)
    out = kg(x)[1]
    assert out.stride() == (1, 4)  # a view of the realized buffer, not a copy


def test_non_contiguous_graph_input(check):
    base = torch.randn(5, 3)
    x = base.t()
    kg = check(lambda x: x * 2 + x.sum(-1, keepdim=True), x)
    assert kg.kernels[0].inputs[0].stride == (1, 3)
    check(lambda x: x * 2, x, run_args=(torch.randn(5, 3).t(),))


def test_graph_input_with_storage_offset(check):
    base = torch.randn(6, 4)
    x = base[2:]
    assert x.storage_offset() == 8
    check(lambda x: x.exp() + x[:, 1:2], x)
    check(lambda x: x.t() @ x, x)
    y = base[1:, 1:]  # offset and non-contiguous
    check(lambda y: y * y.sum(0), y)


def test_expanded_graph_input(check):
    x = torch.randn(1, 4).expand(3, 4)
    kg = check(lambda x, y: x * y, x, torch.randn(3, 1))
    assert kg.kernels[0].inputs[0].stride == (0, 1)


def test_zero_dim_and_empty(check):
    check(lambda x, y: x * y + 1, torch.tensor(2.0), torch.randn(3))
    check(lambda x: x.unsqueeze(0).expand(4) + 1, torch.tensor(2.0))
    check(lambda x: x.t() + 1, torch.randn(0, 3))
    check(lambda x: x.sum(0) * 2, torch.randn(0, 3))


def test_mm_with_transposed_operands(check):
    a, b = torch.randn(5, 3), torch.randn(4, 5)
    kg = check(lambda a, b: a.t() @ b.t(), a, b)
    assert len(kg.externs) == 1 and not kg.kernels
    src = kg.gm.code
    assert "internal_view" in src  # passed as views, not copied


def test_addmm_and_bmm_with_transposes(check):
    bias, a, b = torch.randn(4), torch.randn(5, 3), torch.randn(5, 4)
    check(lambda bias, a, b: torch.addmm(bias, a.t(), b, beta=0.5, alpha=2.0), bias, a, b)
    x, y = torch.randn(2, 5, 3), torch.randn(2, 4, 5)
    check(lambda x, y: torch.bmm(x.transpose(1, 2), y.transpose(-1, -2)), x, y)
    check(lambda x, y: torch.bmm(x[:1].expand(3, 5, 3).transpose(1, 2), y[1:].expand(3, 4, 5).transpose(1, 2)),
          x, y)


def test_extern_of_lazy_and_kernel_of_extern(check):
    a, b = torch.randn(3, 5), torch.randn(5, 4)
    kg = check(lambda a, b: torch.relu((a * 2).t().t() @ b) + 1, a, b)
    assert len(kg.kernels) == 2 and len(kg.externs) == 1
    names = [n.name for n in kg.gm.graph.nodes if n.op == "call_function"]
    assert names.index("kernel0") < names.index(kg.externs[0].name) < names.index("kernel1")


def test_a_transposed_matmul_operand_is_stored_in_its_producers_order(check, reads_of):
    """A backward's weight-gradient operand, `where(h <= 0, 0, g).t()`, is computed row by row
    (the order eager lays it out in) and handed to the mm as a transposed view, not written as
    the transpose's own contiguous buffer by a loop that reads `h` and `g` with a stride."""
    h, g, x = torch.randn(6, 10), torch.randn(6, 10), torch.randn(6, 4)
    kg = check(lambda h, g, x: torch.where(h <= 0, 0.0, g).t() @ x, h, g, x)
    ((read_h,), (read_g,)) = (reads_of(kg)[name] for name in ("h_1", "g_1"))
    assert str(read_h) == str(read_g) == "10*i0 + i1"  # the producer's own order: rows of h and g
    (extern,) = kg.externs
    operand = extern.args[0]
    assert tuple(operand.size) == (10, 6) and tuple(operand.stride) == (1, 10)
    bmm = check(lambda h, g, x: torch.bmm(torch.relu(h).transpose(1, 2), x),
                h.view(2, 3, 10), g.view(2, 3, 10), x.view(2, 3, 4))
    assert tuple(bmm.externs[0].args[0].stride) == (30, 1, 10)


def test_bmm_on_view_of_realized_buffer(check):
    def f(x):
        y = x.exp()
        return torch.bmm(y, y.transpose(1, 2)) + y.sum()

    check(f, torch.randn(2, 3, 4))


def test_module_parameters_become_get_attr_buffers(check):
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.ReLU())
    x = torch.randn(4, 5)
    with torch.no_grad():
        kg = check(model, x)
    assert [n.op for n in kg.gm.graph.nodes].count("get_attr") == 2
    assert [e.op for e in kg.externs] == [torch.ops.aten.addmm.default]
    kg_grad = check(model, x)  # params requiring grad add an aten.detach (an alias)
    assert len(kg_grad.kernels) == 1


def test_output_strides_follow_eager(check):
    x = torch.randn(3, 4).t()
    kg = check(lambda x: x.clone(), x)
    assert kg(x).stride() == x.clone().stride()
