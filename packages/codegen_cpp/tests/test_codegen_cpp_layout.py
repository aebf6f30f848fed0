"""Views, non-contiguous inputs, broadcasting, and the input checks of compiled kernels."""

from __future__ import annotations

import pytest
import torch

from kiln.codegen_cpp._internal.runtime import CompiledKernel


def test_non_contiguous_inputs_compiled_as_such(cpp):
    base = torch.randn(6, 8)
    transposed = base.t()  # strides (1, 8)
    offset = base[1:, 2:]  # storage offset, row stride 8
    stepped = base[::2, ::3]  # strides (16, 3)
    expanded = torch.randn(8, 1).expand(8, 6)  # stride 0

    def f(a, b, c, d):
        return a * 2 + d, b.sum(1), c.relu(), (a + d).amax(0)

    cpp.check(f, transposed, offset, stepped, expanded)


def test_broadcasting_shapes(cpp_parallel):
    def f(a, b, c, s):
        return a + b, a * c, b - c, a + s, (a + b + c + s).sum(0)

    a = torch.randn(3, 1, 5)
    b = torch.randn(4, 1)
    c = torch.randn(5)
    s = torch.tensor(2.0)
    cpp_parallel.check(f, a, b, c, s)


def test_mm_with_transposed_weight_and_epilogue(cpp):
    def f(x, weight, bias):
        h = torch.addmm(bias, x, weight.t()).relu()
        return torch.mm(h, weight), h.sum(1)

    cpp.check(f, torch.randn(5, 7), torch.randn(3, 7), torch.randn(3))
    cpp.check(f, torch.randn(5, 7, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64),
              torch.randn(3, dtype=torch.float64))


def _kernel(compiled):
    """The first compiled kernel of a module (called directly, no layout guard in front)."""
    return next(n.target for n in compiled.module.graph.nodes if isinstance(n.target, CompiledKernel))


def test_kernel_called_with_another_layout_raises(cpp):
    compiled = cpp.build(lambda x: x * 2 + 1, torch.randn(4, 5))
    square = cpp.build(lambda x: x.exp(), torch.randn(4, 4))
    with pytest.raises(ValueError, match=r"has strides that differ.*strides \(1, 4\); expected sizes \(4, 4\), strides \(4, 1\)"):
        _kernel(square)(torch.randn(4, 4).t())
    with pytest.raises(ValueError, match="strides"):
        _kernel(compiled)(torch.randn(4, 10)[:, ::2])
    _kernel(compiled)(torch.randn(4, 10)[:, :5].contiguous())  # the same values, right layout: fine
    transposed = cpp.check(lambda x: x + 1, torch.randn(5, 4).t())
    with pytest.raises(ValueError, match="strides"):
        _kernel(transposed)(torch.randn(4, 5))


def test_module_called_with_another_layout_copies_to_the_traced_one(cpp):
    """Graph inputs go through loopir's ensure_layout: right results, whatever the layout."""
    compiled = cpp.build(lambda x: x * 2 + 1, torch.randn(4, 5))
    x = torch.randn(4, 10)[:, ::2]
    cpp.assert_same(compiled.module(x), x * 2 + 1)
    transposed = cpp.check(lambda x: x + 1, torch.randn(5, 4).t())
    y = torch.randn(4, 5)
    cpp.assert_same(transposed.module(y), y + 1)


def test_wrong_static_shape_raises_instead_of_reading_out_of_bounds(cpp):
    compiled = cpp.build(lambda x: x.sum(1), torch.randn(4, 5))
    with pytest.raises(ValueError, match=r"has sizes that differ.*sizes \(2, 5\).*expected sizes \(4, 5\)"):
        compiled.module(torch.randn(2, 5))  # same strides, fewer rows
    with pytest.raises(ValueError, match="dims"):
        compiled.module(torch.randn(20))


def test_wrong_dtype_raises_type_error(cpp):
    compiled = cpp.build(lambda x: x + 1, torch.randn(3))
    with pytest.raises(TypeError, match="float32"):
        compiled.module(torch.randn(3, dtype=torch.float64))


def test_size_one_dims_accept_any_stride(cpp):
    compiled = cpp.build(lambda x: x * 3, torch.randn(1, 5))
    x = torch.randn(5, 1).t()  # size (1, 5), strides (1, 1)
    cpp.assert_same(compiled.module(x), x * 3)


def test_check_strides_off_skips_the_check(cpp):
    unchecked = cpp.with_options(check_strides=False)
    compiled = unchecked.build(lambda x: x + 1, torch.randn(4, 4))
    base = torch.randn(4, 4)
    # Without the check the kernel reads memory in the order it was built for (row-major), so a
    # transposed input is silently read as its base: the caller's responsibility, documented
    # on CppOptions.check_strides. (The module's layout guard in front of it copies.)
    (out,) = _kernel(compiled)(base.t())
    cpp.assert_same(out, base + 1)
    cpp.assert_same(compiled.module(base.t()), base.t() + 1)


def test_outputs_that_are_views(cpp):
    def f(x):
        y = x * 2
        return y.t(), y[1:, ::2], x.t(), y.view(-1)

    compiled = cpp.check(f, torch.randn(4, 6))
    out = compiled.module(torch.randn(4, 6))
    assert out[0].stride() == (1, 6)


def test_graph_without_kernels(cpp):
    compiled = cpp.check(lambda x, w: (torch.mm(x, w), x.t()), torch.randn(3, 4), torch.randn(4, 2))
    assert not compiled.kernel_graph.kernels
    assert compiled.artifacts.library_path is None


def test_static_kernels_run_from_their_one_layout(cpp):
    """A kernel without size symbols runs from its precomputed layouts (`_static_call`); any
    other input leaves it to the general path, which checks and names what differs."""
    compiled = cpp.build(lambda x: x * 2 + 1, torch.randn(4, 5))
    kernel = _kernel(compiled)
    x = torch.randn(4, 5)
    (out,) = kernel._static_call((x,))
    cpp.assert_same(out, x * 2 + 1)
    assert kernel._guard is False or callable(kernel._guard)  # built from the first inputs (layout_guard)
    for other in [(torch.randn(5, 4).t(),), (torch.randn(4, 5, dtype=torch.float64),), ([1.0] * 5,), (x, x)]:
        assert kernel._static_call(other) is None
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # may ask to fill new outputs: the general path does
    try:
        assert kernel._static_call((x,)) is None
        cpp.assert_same(kernel(x)[0], x * 2 + 1)
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("name", ["index", "scatter_add"])
def test_kernels_with_checks_or_scatter_bases_run_static(cpp, name):
    """Run-time checks (an index's bounds) and a scatter's base copy are on the static path too:
    its status raises the same error as the general path, and the base is copied first."""
    fns = {"index": lambda x, i: x[i] * 2,
           "scatter_add": lambda x, i: x.scatter_add(0, i.view(-1, 1).expand(-1, 3), x[:4] * 2)}
    x, i = torch.randn(5, 3), torch.tensor([0, 4, 2, 1])
    compiled = cpp.check(fns[name], x, i)
    (kernel,) = [n.target for n in compiled.module.graph.nodes if isinstance(n.target, CompiledKernel) and n.target.checks]
    assert kernel._static is not None and bool(kernel._scatter_bases) == (name == "scatter_add")
    static, ran = kernel._static_call, []
    kernel._static_call = lambda inputs: ran.append(static(inputs)) or ran[-1]
    for _ in range(2):
        cpp.assert_same(compiled.module(x, i), fns[name](x, i))
    assert len(ran) == 2 and all(outputs is not None for outputs in ran)
    if name == "index":
        with pytest.raises(IndexError, match="out of bounds for a dimension of size 5"):
            compiled.module(x, torch.tensor([0, 4, 5, 1]))
        assert len(ran) == 2  # raised on the static path (the general path never ran)
