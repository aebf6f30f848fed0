"""Run-time checks in generated C++: an out-of-range indirect index raises IndexError and an
integer division or remainder by zero raises RuntimeError("ZeroDivisionError"), in this process
(no out-of-bounds read, no SIGFPE), on serial and OpenMP paths, in pointwise and reduction loops."""

from __future__ import annotations

import pytest
import torch

INDEXING = {
    "index": lambda x, i: x[i] * 2,
    "index_select": lambda x, i: torch.index_select(x, 0, i),
    "gather": lambda x, i: torch.gather(x, 0, i.view(-1, 1).expand(-1, 3)),
    "gather_sum": lambda x, i: torch.gather(x, 0, i.view(-1, 1).expand(-1, 3)).sum(0),
}


@pytest.mark.parametrize("name", INDEXING)
@pytest.mark.parametrize("bad", [5, 1 << 40, -6, -(1 << 40)])
@pytest.mark.parametrize("builder", ["cpp", "cpp_parallel"])
def test_out_of_range_index_raises(name, bad, builder, request):
    cpp = request.getfixturevalue(builder)
    x, fn = torch.randn(5, 3), INDEXING[name]
    # valid negative indices wrap as in eager (index_select and gather refuse them in eager)
    good = torch.tensor([0, -1, 4, 2, -5]) if name == "index" else torch.tensor([0, 4, 4, 2, 1])
    module = cpp.check(fn, x, good).module
    bad_index = torch.tensor([0, 1, bad, 2, 3])
    with pytest.raises((IndexError, RuntimeError)):
        fn(x, bad_index)  # eager refuses it too
    with pytest.raises(IndexError, match=r"kernel0: buffer buf\d+ \(from \w+\): an index is out of bounds for "
                                         r"a dimension of size 5"):
        module(x, bad_index)
    cpp.assert_same(module(x, good), fn(x, good))  # the failure left nothing behind


def test_check_is_one_compare_and_the_load_is_clamped(cpp_parallel):
    source = cpp_parallel.build(INDEXING["index"], torch.randn(5, 3), torch.tensor([1])).source
    assert "static_cast<uint64_t>(ind0) >= static_cast<uint64_t>(5)" in source
    assert "ind0 = outside_ind0 ? 0 : ind0;" in source
    assert "int32_t* __restrict__ kiln_status" in source and "reduction(max:kiln_fail)" in source
    plain = cpp_parallel.build(lambda x: x * 2, torch.randn(5, 3)).source
    assert "kiln_status" not in plain  # kernels without checks keep their signature


def test_symbolic_sizes_report_the_size_at_the_call(cpp):
    fn = INDEXING["index"]
    module = cpp.build(fn, torch.randn(5, 3), torch.tensor([1, 2]), tracing_mode="symbolic").module
    x = torch.randn(9, 4)
    cpp.assert_same(module(x, torch.tensor([8, -9, 0])), fn(x, torch.tensor([8, -9, 0])))
    with pytest.raises(IndexError, match="dimension of size 9"):
        module(x, torch.tensor([9]))


def test_index_into_an_empty_dim_raises_without_reading(cpp):
    fn = INDEXING["index"]
    compiled = cpp.build(fn, torch.randn(0, 3), torch.tensor([0]), tracing_mode="fake")
    assert "(outside_ind0) ? " in compiled.source  # size 0: no clamped index is in bounds, the load is guarded
    with pytest.raises(IndexError, match="dimension of size 0"):
        compiled.module(torch.randn(0, 3), torch.tensor([-1]))


DIVISIONS = {
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": torch.remainder,
    "fmod": torch.fmod,
}


@pytest.mark.parametrize("name", DIVISIONS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("builder", ["cpp", "cpp_parallel"])
def test_integer_division_by_zero_raises_like_eager(name, dtype, builder, request):
    cpp = request.getfixturevalue(builder)
    fn = DIVISIONS[name]
    a, b = torch.arange(-20, 20, dtype=dtype), torch.arange(40, dtype=dtype) % 7 - 3
    module = cpp.check(fn, a, b + (b == 0)).module
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(a, b)
    with pytest.raises(RuntimeError, match=r"kernel0: buffer buf0 \(from \w+\): ZeroDivisionError"):
        module(a, b)  # the process survives: no SIGFPE
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        cpp.build(lambda x, y: fn(x, y).sum(), a, b).module(a, b)  # inside a reduction loop


@pytest.mark.parametrize("name", DIVISIONS)
def test_float_division_by_zero_stays_ieee(name, cpp):
    a, b = torch.tensor([5.0, -3.0, 0.0, 2.0]), torch.tensor([0.0, -0.0, 0.0, 1.0])
    cpp.check(DIVISIONS[name], a, b)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_smallest_integer_divided_by_minus_one_does_not_trap(dtype, cpp):
    smallest = torch.iinfo(dtype).min
    a, b = torch.tensor([smallest, 7, smallest], dtype=dtype), torch.tensor([-1, -1, 3], dtype=dtype)
    module = cpp.build(DIVISIONS["trunc"], a, b, tracing_mode="fake").module
    # eager's trunc division traps here; wrapping as its floor division does: smallest / -1 == smallest
    cpp.assert_same(module(a, b), torch.tensor([smallest, -7, -(-smallest // 3)], dtype=dtype))
    for name in ("floor", "remainder", "fmod"):
        cpp.check(DIVISIONS[name], a, b)
