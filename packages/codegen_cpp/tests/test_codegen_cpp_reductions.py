"""Reductions: the serial and OpenMP-parallel paths, NaN propagation, accuracy, fusion shapes."""

from __future__ import annotations

import math
import re

import pytest
import torch

NAN = math.nan


# These tests read the scalar path's OpenMP pragmas; the vector path's reductions are
# test_codegen_cpp_vector_reductions.py's (the semantics checked there are the same).
@pytest.fixture
def cpp(cpp):
    return cpp.with_options(vectorize=False)


@pytest.fixture
def cpp_parallel(cpp_parallel):
    return cpp_parallel.with_options(vectorize=False)


def _with_nan(shape, positions, seed=0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    for pos in positions:
        x.view(-1)[pos] = NAN
    return x


def test_full_reductions_to_0d_use_the_parallel_path(cpp_parallel):
    def f(x, i, b):
        return (x.sum(), x.amax(), x.amin(), x.mean(), i.sum(), i.amax(), i.amin(), b.sum(), b.amax(), b.amin())

    x = torch.randn(7, 33)
    i = torch.randint(-100, 100, (7, 33))
    b = torch.rand(7, 33) > 0.3
    compiled = cpp_parallel.check(f, x, i, b)
    # Every 0-d reduction (except bool max/min, which have no OpenMP reduction) is in one loop
    # (kiln.loopir.codegen.shared_reduction_loops) whose outermost loop is split over threads; nothing is left serial.
    (pragma,) = [line for line in compiled.source.splitlines() if "#pragma omp parallel for reduction(" in line]
    assert pragma.count("reduction(max:") == 2 and pragma.count("reduction(min:") == 2
    assert pragma.count("reduction(+:") == 6  # four sums, two NaN counts


def test_one_dimensional_full_reduction_is_parallel_and_simd(cpp_parallel):
    compiled = cpp_parallel.check(lambda x: (x.sum(), x.amax()), torch.randn(1000))
    (pragma,) = [line for line in compiled.source.splitlines() if "#pragma omp parallel for simd reduction(" in line]
    assert "reduction(+:acc_buf0)" in pragma and "reduction(max:acc_buf1)" in pragma  # one shared loop


def test_nan_propagates_through_max_min_in_every_path(cpp, cpp_parallel):
    def f(x, y):
        return (x.amax(), x.amin(), x.amax(1), x.amin(0, keepdim=True), x.amax((0, 1)),
                torch.maximum(x, y), torch.minimum(y, x), torch.relu(x))

    x = _with_nan((5, 40), [3, 77])  # rows 0 and 1 have a NaN; rows 2..4 do not
    y = _with_nan((5, 40), [4, 199], seed=1)
    cpp.check(f, x, y)
    cpp_parallel.check(f, x, y)
    cpp.check(f, torch.randn(5, 40), torch.randn(5, 40))  # and no spurious NaN without them


def test_all_nan_and_infinite_rows(cpp):
    x = torch.tensor([[NAN, NAN], [-math.inf, -math.inf], [math.inf, 1.0], [NAN, math.inf]])
    cpp.check(lambda x: (x.amax(1), x.amin(1), x.sum(1), x.mean(1)), x)


def test_float32_sums_are_accumulated_in_double(cpp, cpp_parallel):
    """The result is the float64 sum rounded once: at most one rounding away from it, which eager
    (float accumulation) does not guarantee."""
    x = torch.randn(64, 20000, generator=torch.Generator().manual_seed(0)) * 100
    truth_rows = x.double().sum(1)
    truth_all = x.double().sum()
    for builder in (cpp, cpp_parallel):
        rows, total = builder.build(lambda x: (x.sum(1), x.sum()), x).module(x)
        ulp_rows = torch.finfo(torch.float32).eps * truth_rows.abs()
        assert ((rows.double() - truth_rows).abs() <= ulp_rows).all()
        assert abs(total.double() - truth_all) <= torch.finfo(torch.float32).eps * abs(truth_all)


def test_reduction_over_leading_and_middle_dims(cpp_parallel):
    def f(x):
        return x.sum(0), x.amax(1), x.amin((0, 2)), x.mean((0, 2), keepdim=True), x.sum(-1, keepdim=True)

    cpp_parallel.check(f, torch.randn(6, 5, 7))


def test_reduction_and_pointwise_fuse_into_one_kernel(cpp):
    def f(x):  # variance by rows: sum, mean, then a second reduction reading the first
        mean = x.mean(1, keepdim=True)
        return ((x - mean) ** 2).sum(1) / (x.shape[1] - 1), x.amax(1) - x.amin(1)

    compiled = cpp.check(f, torch.randn(9, 31))
    assert len(compiled.kernel_graph.kernels) < 5


def test_empty_reductions(cpp):
    cpp.check(lambda x: (x.sum(1), x.sum(), x.mean(0), x.sum(0)), torch.randn(0, 4))
    cpp.check(lambda x: (x.sum(0), x.sum()), torch.randn(3, 0))


def test_reduction_of_0d_tensor(cpp):
    cpp.check(lambda x: (x.sum(), x.amax(), x.mean(), x + 1), torch.tensor(2.5))


def test_without_openmp_runs_serially(cpp):
    serial = cpp.with_options(openmp=False, parallel_threshold=0)
    compiled = serial.check(lambda x: (x.sum(), x.amax(1), x * 2), _with_nan((4, 9), [5]))
    assert "omp parallel" not in compiled.source
    assert "#pragma omp simd" in compiled.source  # still vectorization hints (-fopenmp-simd)
    vector = serial.with_options(vectorize=True).check(lambda x: (x.sum(), x.amax(1), x * 2), _with_nan((4, 9), [5]))
    assert "// vector code" in vector.source and "// scalar loop" not in vector.source  # kiln's own SIMD


def _softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def _layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keepdim=True)
    return centered * torch.rsqrt(var + 1e-5) * w + b


def test_softmax_rows_run_in_one_kernel(cpp, cpp_parallel):
    for builder in (cpp, cpp_parallel):
        x = torch.randn(37, 129)
        x[3, 5] = float("nan")
        x[4] = float("-inf")
        compiled = builder.check(_softmax, x)
        (kernel,) = compiled.kernel_graph.kernels
        assert sum(kernel.is_row(n) for n in kernel.nodes) == 2
        assert compiled.source.count("(row loop)") == 2


def test_layer_norm_rows_with_dynamic_shapes(cpp_parallel):
    args = (torch.randn(6, 33), torch.randn(33), torch.randn(33))
    calls = [(torch.randn(9, 17), torch.randn(17), torch.randn(17))]
    compiled = cpp_parallel.check(_layer_norm, *args, tracing_mode="symbolic", calls=calls, atol=1e-5, rtol=1e-5)
    assert len(compiled.kernel_graph.kernels) == 1


def test_one_dimensional_softmax_row_loop_is_parallel(cpp_parallel):
    compiled = cpp_parallel.check(_softmax, torch.randn(1000))
    assert "#pragma omp parallel for simd" in compiled.source


def test_row_temporaries_live_in_a_scratch_row_per_thread(cpp, cpp_parallel):
    x = torch.randn(37, 129)
    x[3, 5] = float("nan")
    x[4] = float("-inf")
    for builder in (cpp, cpp_parallel, cpp.with_options(openmp=False)):
        compiled = builder.check(_softmax, x, row_temporaries=True)
        (kernel,) = compiled.kernel_graph.kernels
        (temporary,) = kernel.row_temporaries
        assert len(kernel.outputs) == 1 and f"out_{temporary.name}" not in compiled.source
        assert compiled.source.count("(row loop, scratch row)") == 1
        assert f"row_{temporary.name}_storage" in compiled.source
    # parallel outer loop: each thread declares its scratch rows inside the parallel region
    assert re.search(r"#pragma omp parallel\n *\{\n *std::unique_ptr<float\[\]> row_",
                     compiled_source(cpp_parallel, _softmax, x))


def compiled_source(builder, fn, *args):
    return builder.build(fn, *args, row_temporaries=True).source


def test_row_temporaries_with_dynamic_shapes_and_several_row_dims(cpp_parallel):
    args = (torch.randn(6, 33), torch.randn(33), torch.randn(33))
    calls = [(torch.randn(9, 17), torch.randn(17), torch.randn(17))]
    compiled = cpp_parallel.check(_layer_norm, *args, tracing_mode="symbolic", calls=calls, row_temporaries=True,
                                  atol=1e-5, rtol=1e-5)
    (kernel,) = compiled.kernel_graph.kernels
    assert kernel.row_temporaries and len(kernel.outputs) == 1

    def softmax_2d(x):  # rows of [4, 5]: a two-variable scratch row
        e = (x - x.amax((1, 2), keepdim=True)).exp()
        return e / e.sum((1, 2), keepdim=True)

    compiled = cpp_parallel.check(softmax_2d, torch.randn(3, 4, 5), row_temporaries=True)
    (kernel,) = compiled.kernel_graph.kernels
    assert len(kernel.row_ranges) == 2 and kernel.row_temporaries


def test_one_dimensional_softmax_shares_one_scratch_row_between_threads(cpp_parallel):
    compiled = cpp_parallel.check(_softmax, torch.randn(1000), row_temporaries=True)
    assert "#pragma omp parallel for simd" in compiled.source and "#pragma omp parallel if(" not in compiled.source


def test_residual_add_runs_as_a_row_loop_before_the_layer_norm(cpp_parallel):
    def residual_layer_norm(x, residual, w, b):
        return _layer_norm(x + residual, w, b)

    args = (torch.randn(6, 33), torch.randn(6, 33), torch.randn(33), torch.randn(33))
    calls = [(torch.randn(9, 17), torch.randn(9, 17), torch.randn(17), torch.randn(17))]
    compiled = cpp_parallel.check(residual_layer_norm, *args, tracing_mode="symbolic", calls=calls,
                                  row_temporaries=True, atol=1e-5, rtol=1e-5)
    (kernel,) = compiled.kernel_graph.kernels
    assert kernel.is_row(kernel.nodes[0]) and len(kernel.row_temporaries) == 2 and len(kernel.outputs) == 1
