"""Vector reductions (`_internal/vector_reduction_source.py`): several accumulators per
reduction, tree folds, and every reduction kind (sum, prod, max/min, any/all, argmax/argmin)
as vector code at every SIMD width, with eager's NaN and tie rules."""

from __future__ import annotations

import pytest
import torch

WIDTHS = [4, 16, 32, 64]


@pytest.fixture
def cpp(cpp):
    return cpp.with_options(vectorize=True)


def _rows(cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float rows with many ties (small integers), NaNs in some rows, an all -inf row, an
    all-equal row; int64 rows with ties."""
    torch.manual_seed(0)
    x = (torch.randn(8, cols) * 2).round()
    x[1, cols // 2] = float("nan")
    x[2, cols - 1], x[2, cols // 3] = float("nan"), float("nan")
    x[3, :] = float("-inf")
    x[4, :] = 1.5
    x[5, cols - 1] = 100.0  # the extreme in the tail
    return x, torch.randint(-3, 3, (8, cols))


def _every_kind(x, n):
    scaled = torch.minimum(torch.maximum(x, torch.tensor(-2.0)), torch.tensor(2.0)) * 0.25 + 1  # finite products
    return (x.argmax(-1), x.argmin(-1), x.double().argmax(-1), n.argmax(-1), n.argmin(-1), scaled.prod(-1),
            (x > 0).any(-1), (x > -2).all(-1), n.sum(-1), n.amax(-1), x.amax(-1), x.double().amin(-1), x.sum(-1))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("cols", [5, 37, 131])
def test_every_reduction_kind_is_vector_code_and_matches_eager(cpp, width, cols):
    compiled = cpp.with_options(flags=(*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}")).check(
        _every_kind, *_rows(cols), rtol=1e-5, atol=1e-6)  # products: another rounding order
    source = compiled.source
    assert "// scalar loop" not in source, source
    for fold in ("kiln::arg_fold<true>", "kiln::arg_fold<false>", "kiln::reduce_mul", "kiln::reduce_or",
                 "kiln::reduce_and", "kiln::reduce_add", "kiln::reduce_max", "kiln::reduce_min"):
        assert fold in source, fold


def test_reduction_loops_keep_four_independent_accumulators(cpp):
    compiled = cpp.check(lambda x: (x.sum(-1), x.amax(-1)), torch.randn(4, 300))
    assert compiled.source.count("// vector code, 4 accumulators") == 1  # one loop for both (kiln.loopir.codegen.shared_reduction_loops)
    for part in range(4):
        assert f"constexpr int part = {part};" in compiled.source
    # the float32 sum's accumulators folded as a tree into its total (a short row's: float32
    # or float64 by KILN_LANES, test_codegen_cpp_vector.py), then its lanes
    tree = "((vacc_buf0[0] + vacc_buf0[1]) + (vacc_buf0[2] + vacc_buf0[3]))"
    assert f"vtotal_buf0 = kiln::add_partials(vtotal_buf0, {tree});" in compiled.source
    assert "kiln::reduce_add(vtotal_buf0)" in compiled.source
    long = cpp.check(lambda x: x.sum(-1), torch.randn(2, 5000), rtol=1e-5, atol=1e-5)
    assert f"vtotal_buf0 = vtotal_buf0 + kiln::widen2({tree});" in long.source


def test_first_nan_and_first_tie_across_accumulators_and_lanes(cpp):
    cols = 300
    x = torch.zeros(6, cols)
    x[0, 200], x[0, 7] = 5.0, 5.0  # tie: 7 (accumulator 0) beats 200
    x[1, 150], x[1, 90] = float("nan"), float("nan")  # first NaN: 90
    x[2, 299] = float("nan")  # in the tail
    x[3, :] = 2.0  # all equal: 0
    x[4, 64], x[4, 3] = -1.0, -1.0
    compiled = cpp.check(lambda x: (x.argmax(-1), x.argmin(-1)), x)
    assert "kiln::arg_combine" in compiled.source


def _every_kind_over_dim0(x, n):
    return (x.sum(0), x.amax(0), x.double().amin(0), x.argmax(0), x.argmin(0), n.argmax(0), (x > 0).any(0),
            (x > -2).all(0), n.sum(0), (x * 0.25 + 1).prod(0), x.t().sum(-1), x.mean(0) * 2 + 1)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("cols", [5, 37])
def test_reductions_over_an_outer_dim_are_vector_code_across_the_outputs(cpp, width, cols):
    x, n = _rows(cols)
    x, n = x.t().contiguous(), n.t().contiguous()  # reduce the rows' dim, now the outer one
    compiled = cpp.with_options(flags=(*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}")).check(
        _every_kind_over_dim0, x, n, rtol=1e-5, atol=1e-6)
    assert "// scalar loop" not in compiled.source, compiled.source
    assert "kiln::arg_update<true>(vacc_" in compiled.source  # one accumulator per output lane
    assert "kiln::reduce_" not in compiled.source  # no lane folds: each lane is an output


def _whole(x, n):
    e = (x - x.amax()).exp()  # a softmax over one row, as decomp writes it: row loops without an outer loop
    return (x.sum(), x.amax(), x.double().amin(), n.sum(), (x > 0).any(), (x > -50).all(), (x[:500] * 1e-3 + 1).prod(),
            e / e.sum())


@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("size", [3, 1000, 40000])
def test_whole_tensor_reductions_and_row_loops_split_across_threads(cpp_parallel, size, nan):
    torch.manual_seed(0)
    x, n = torch.randn(size), torch.randint(-5, 5, (size,))
    if nan:
        x[size // 2] = float("nan")
    compiled = cpp_parallel.with_options(vectorize=True).check(_whole, x, n, rtol=1e-5, atol=1e-6)
    assert "// scalar loop" not in compiled.source, compiled.source
    assert "// split in 64 chunks across threads" in compiled.source
    assert "#pragma omp parallel for if(" in compiled.source  # the softmax's row loops


def test_an_argmax_split_across_threads_stays_scalar_and_says_why(cpp_parallel):
    compiled = cpp_parallel.with_options(vectorize=True).check(lambda x: x.argmax(), torch.randn(1000))
    assert "// scalar loop: not vectorized: a argmax reduction split across threads" in compiled.source


@pytest.mark.parametrize("shape", [(3, 5), (70, 33), (300, 200)])
def test_whole_tensor_reductions_of_several_dims_split_across_threads(cpp_parallel, shape):
    torch.manual_seed(0)
    x = torch.randn(shape)
    x[shape[0] // 2, shape[1] // 3] = float("nan")
    compiled = cpp_parallel.with_options(vectorize=True).check(
        lambda x: (x.sum(), x.amax(), (torch.where(x == x, x, 0.0) ** 2).mean(), (x > 3).any()), x, rtol=1e-5, atol=1e-6)
    assert "// scalar loop" not in compiled.source, compiled.source
    assert "// split in 64 chunks across threads" in compiled.source


def test_a_reduction_of_a_0d_tensor_stays_scalar_and_says_why(cpp):
    compiled = cpp.check(lambda x: (x.sum(), x.amax(), x.mean(), x + 1), torch.tensor(2.5))
    assert "// scalar loop: not vectorized: a reduction over no dim" in compiled.source


def test_empty_reductions_on_the_vector_path(cpp, cpp_parallel):
    for builder in (cpp, cpp_parallel.with_options(vectorize=True)):
        builder.check(lambda x: (x.sum(1), x.sum(), x.mean(0), x.sum(0), x.amax(1)), torch.randn(0, 4))
        builder.check(lambda x: (x.sum(0), x.sum(), x.prod(1)), torch.randn(3, 0))


@pytest.mark.parametrize("tracing_mode", ["real", "symbolic"])
@pytest.mark.parametrize("cols", [32, 37])
def test_column_sums_equal_up_to_size1_dims_in_one_kernel(cpp, cpp_parallel, tracing_mode, cols):
    """A layer norm's weight and bias gradients (`[C]`, over `[2, 16]`) and a linear's bias
    gradient (`[1, C]`, over 32 flattened rows) share one kernel (loopir's scheduler), each with
    its own reduction loop; vector code with a tail (37), serial and OpenMP, symbolic sizes."""
    def f(g, x, h):
        return (g * x).sum((0, 1)), g.sum((0, 1)), h.reshape(-1, h.shape[-1]).sum(0, keepdim=True)

    args = [torch.randn(2, 16, cols) for _ in range(3)]
    for builder in (cpp, cpp_parallel):
        compiled = builder.check(f, *args, tracing_mode=tracing_mode, rtol=1e-5, atol=1e-5)
        assert len(compiled.kernel_graph.kernels) == 1
        assert "vector code" in compiled.source
