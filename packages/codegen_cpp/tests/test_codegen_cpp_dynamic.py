"""Dynamic shapes: one build from a symbolic trace serves every size."""

from __future__ import annotations

import pytest
import torch


def _randn(*shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))


def test_one_build_runs_for_several_sizes(cpp):
    def f(x, y):
        h = torch.relu(x) * y + 1
        return h.sum(1), h.amax(), (x - x.mean(1, keepdim=True)) / (y.abs() + 1), x.sum(0)

    # 300 x 200 crosses the default parallel threshold at run time; the others do not.
    sizes = [(3, 4), (5, 7), (2, 2), (300, 200), (17, 1)]
    calls = [(_randn(*s), _randn(*s)) for s in sizes]
    compiled = cpp.check(f, _randn(3, 4), _randn(3, 4), tracing_mode="symbolic", calls=calls,
                         atol=1e-4, rtol=1e-5)
    symbols = {s for k in compiled.kernel_graph.kernels for s in k.symbols}
    assert symbols, "a symbolic trace should give kernels with size parameters"
    for sym in symbols:
        assert f"int64_t {sym}" in compiled.source
    assert len(list(cpp.options.cache_dir.iterdir())) == 1  # built once, never per size


def test_dynamic_views_slices_and_externs(cpp_parallel):
    def f(x, w):
        n = x.shape[0]
        flat = x.reshape(n * x.shape[1])
        return (flat[1:] * 2, x.t() + 1, x[:, :2].sum(1), torch.mm(x, w).relu(), x.unsqueeze(0).expand(2, -1, -1) * 3,
                x[-1], x * n)

    # Distinct sizes when tracing: make_fx gives equal sizes one symbol ("duck sizing").
    calls = [(_randn(5, 6), _randn(6, 2)), (_randn(8, 3), _randn(3, 4))]
    cpp_parallel.check(f, _randn(3, 4), _randn(4, 5), tracing_mode="symbolic", calls=calls)


def test_select_of_a_dimension_the_kernel_does_not_iterate(cpp):
    # The kernel reads x[0, 0, :]: its only size parameter is the last dimension, yet the
    # input check must still know the others (bound from the input itself).
    def f(x):
        return x[0, 0, :] * 2, x[1, :, 0].sum()

    calls = [(_randn(3, 4, 5),), (_randn(2, 6, 7),)]
    compiled = cpp.check(f, _randn(3, 4, 5), tracing_mode="symbolic", calls=calls)
    x = _randn(5, 4, 3).permute(2, 1, 0)  # another layout: the module's guard copies it
    for got, expected in zip(compiled.module(x), f(x)):
        cpp.assert_same(got, expected)


def test_inputs_of_inconsistent_sizes_raise(cpp):
    compiled = cpp.build(lambda x, y: x + y, _randn(3, 4), _randn(3, 4), tracing_mode="symbolic")
    cpp.assert_same(compiled.module(_randn(6, 2), _randn(6, 2)), _randn(6, 2) + _randn(6, 2))
    with pytest.raises(ValueError, match="sizes"):
        compiled.module(_randn(6, 2), _randn(5, 2))  # would read past the end of y


def test_non_contiguous_call_of_dynamic_build(cpp):
    compiled = cpp.build(lambda x: x.exp(), _randn(3, 4), tracing_mode="symbolic")
    x = _randn(5, 6).t()
    cpp.assert_same(compiled.module(x), x.exp())  # copied to the traced layout by the guard
    kernel = next(n.target for n in compiled.module.graph.nodes if type(n.target).__name__ == "CompiledKernel")
    with pytest.raises(ValueError, match="strides"):
        kernel(x, 6, 5)


def test_size_of_another_input_used_as_a_value(cpp):
    def f(x, y):
        return y * x.shape[0], (y + x.sum()) / x.numel()

    calls = [(_randn(4), _randn(6)), (_randn(9), _randn(2))]
    cpp.check(f, _randn(3), _randn(5), tracing_mode="symbolic", calls=calls)
