"""Independent reductions over the same rows share one loop (`kiln.loopir.codegen.shared_reduction_loops`): one
pass over the row, each accumulator as in a loop of its own (the same results bit for bit),
eager's values (NaN rows, argmax ties, float64, bfloat16, tails); a reduction that reads an
earlier one's result (softmax's sum of exp(x - max)) keeps a loop of its own."""

from __future__ import annotations

import re

import pytest
import torch

_REDUCTION_LOOP = re.compile(r"for \(int64_t r\d+\w* = ")


def row_passes(source: str) -> int:
    """The passes over reduction dims in the kernels of `source`: runs of consecutive sibling
    loops over a reduction variable (r0, r0_block, r0_span, ...) that are not inside such a
    loop. One vector reduction loop (its main and remainder loops, then its tail) is one run;
    any other statement between two loops ends a run."""
    kernels = source[source.index('extern "C" void kernel'):]
    passes, depth = 0, 0
    inside: int | None = None  # the depth of the reduction loop the lines are in
    last_was_loop: dict[int, bool] = {}  # depth -> whether the last statement there was a reduction loop
    for line in kernels.splitlines():
        text = line.strip()
        opened = text.count("{") - text.count("}")
        if text and not text.startswith(("#", "//", "}")) and inside is None:
            loop = bool(_REDUCTION_LOOP.match(text))
            passes += loop and not last_was_loop.get(depth, False)
            last_was_loop[depth] = loop
            inside = depth if loop else None
        depth += opened
        if opened > 0:
            last_was_loop.pop(depth, None)  # a new block: no statement in it yet
        if inside is not None and depth <= inside:
            inside = None
    return passes


@pytest.fixture
def cpp(cpp):
    return cpp.with_options(vectorize=True)


def _rows(cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rows with ties (small integers), NaNs in two rows, an all -inf row, an all-equal row,
    and the extremes at the row's end (in the tail of the vector loop)."""
    x = (torch.randn(6, cols, generator=torch.Generator().manual_seed(cols)) * 2).round()
    x[1, cols // 2] = float("nan")
    x[2, cols - 1] = float("nan")
    x[3, :] = float("-inf")
    x[4, :] = 1.5
    x[5, cols - 1] = 100.0
    return x.to(dtype)


PAIRS = {
    "sum and amax": lambda x: (x.sum(-1), x.amax(-1)),
    "sum and sum of squares": lambda x: (x.sum(-1), (x * x).sum(-1)),
    "amin and amax": lambda x: (x.amin(-1), x.amax(-1)),
    "argmax and amax": lambda x: (x.argmax(-1), x.amax(-1)),
    "argmin, argmax, amin and amax": lambda x: (x.argmin(-1), x.argmax(-1), x.amin(-1), x.amax(-1)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("cols", [1000, 7])
@pytest.mark.parametrize("name", list(PAIRS))
def test_independent_reductions_of_a_row_share_one_loop_and_match_eager(cpp, name, cols, dtype):
    fn = PAIRS[name]
    x = _rows(cols, dtype)
    tolerance = {"atol": 1e-2, "rtol": 1e-2} if dtype == torch.bfloat16 else {}  # a sum's rounding
    compiled = cpp.check(fn, x, **tolerance)
    assert "// scalar loop" not in compiled.source
    assert row_passes(compiled.source) == 1, compiled.source


@pytest.mark.parametrize("width", [16, 32, 64])
def test_each_reduction_of_a_shared_loop_is_bit_for_bit_its_loop_alone(cpp, width):
    """Joining changes no accumulator: a float32 sum keeps its PARTS accumulators and its flushes
    into the total (a large value then ones: the worst case of float32 partials), max/min their
    NaN masks, argmax its first position, at every vector width and with a tail."""
    cpp = cpp.with_options(flags=(*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}"))
    x = torch.ones(3, 40001)
    x[:, 0] = 2.0 ** 25
    x[1, 17], x[2, 40000] = float("nan"), 3.0
    shared = cpp.build(lambda x: (x.sum(-1), x.amax(-1), x.argmax(-1), (x * x).sum(-1)), x)
    assert row_passes(shared.source) == 1
    alone = [cpp.build(fn, x).module(x) for fn in (lambda x: x.sum(-1), lambda x: x.amax(-1),
                                                     lambda x: x.argmax(-1), lambda x: (x * x).sum(-1))]
    for joined, single in zip(shared.module(x), alone):
        cpp.assert_same(joined, single, atol=0, rtol=0)


def test_the_shared_loop_loads_the_row_once(cpp):
    x = torch.randn(8, 1000)
    loads = cpp.build(lambda x: x.sum(-1), x).source.count("in_x_1")
    assert cpp.build(lambda x: (x.sum(-1), x.amax(-1), x.amin(-1)), x).source.count("in_x_1") == loads


def test_a_reduction_of_an_earlier_result_keeps_its_own_loop(cpp):
    """Softmax's sum of exp(x - amax) reads the amax: two loops. An independent sum of the same
    rows joins the amax's loop (the first), not the dependent one."""
    def max_and_exp_sum(x):
        m = x.amax(-1, keepdim=True)
        return m, (x - m).exp().sum(-1)

    x = _rows(1000)
    assert row_passes(cpp.check(max_and_exp_sum, x, rtol=1e-5, atol=1e-5).source) == 2
    with_sum = cpp.check(lambda x: (*max_and_exp_sum(x), x.sum(-1)), x, rtol=1e-5, atol=1e-5)
    assert row_passes(with_sum.source) == 2


@pytest.mark.parametrize("vectorize", [True, False])
def test_whole_tensor_reductions_share_one_loop_split_across_threads(cpp_parallel, vectorize):
    x = torch.randn(37, 131)
    x[5, 7] = float("nan")
    compiled = cpp_parallel.with_options(vectorize=vectorize).check(
        lambda x: (x.sum(), x.amax(), (x * x).sum(), x.amin()), x, rtol=1e-5, atol=1e-5)
    assert row_passes(compiled.source) == 1
    assert ("split in 64 chunks" in compiled.source) == vectorize
    assert compiled.source.count("#pragma omp parallel for") == 1


def test_reductions_over_an_outer_dim_share_one_loop(cpp):
    x = torch.randn(64, 1000)
    x[3, 10] = float("nan")
    compiled = cpp.check(lambda x: (x.sum(0), x.amax(0), x.amin(0)), x, rtol=1e-5, atol=1e-5)
    assert "// vector code" in compiled.source and "// scalar loop" not in compiled.source
    assert row_passes(compiled.source) == 2  # the loop over whole vectors of outputs, and their tail


def test_scalar_loops_share_a_loop_where_their_openmp_clauses_allow(cpp):
    """Scalar code: reductions with OpenMP reduction clauses share a simd loop, argmax/argmin
    (no clause) share a serial one; the two kinds keep loops apart (the clauses of one simd
    loop must cover every accumulator)."""
    scalar = cpp.with_options(vectorize=False)
    x = _rows(1000)
    both = scalar.check(lambda x: (x.sum(-1), x.amax(-1)), x)
    assert row_passes(both.source) == 1 and "reduction(+:acc_buf0) reduction(max:acc_buf1)" in both.source
    assert row_passes(scalar.check(PAIRS["argmin, argmax, amin and amax"], x).source) == 2
    assert row_passes(scalar.check(lambda x: (x.argmin(-1), x.argmax(-1)), x).source) == 1


def test_row_passes_counts_loops_not_lines():
    assert row_passes('extern "C" void kernel0() {\n    for (int64_t r0 = 0; r0 < 4; ++r0) {\n'
                      '        for (int64_t r1 = 0; r1 < 4; ++r1) {\n        }\n    }\n    int a = 0;\n'
                      '    for (int64_t r0_block = 0; r0_block < 4; ++r0_block) {\n    }\n'
                      '    for (int64_t r0 = 4; r0 < 5; ++r0) {\n    }\n}\n') == 2
