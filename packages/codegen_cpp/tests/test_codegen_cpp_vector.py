"""Explicit vector code: every SIMD width, tails, dtypes, fallbacks, and the regression guard
that hot loops use kiln's vector layer (checked on the generated source, not by timing)."""

from __future__ import annotations

import functools
import re
import subprocess

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, loopir
from kiln.codegen_cpp._internal.reduction_source import LANEWISE_RUN
from kiln.codegen_cpp._internal.vector_loops import FLUSH_BLOCKS
from kiln.codegen_cpp._internal.vector_reduction_source import MAX_LANES, PARTS, SHORT_ROW
from kiln.codegen_cpp._internal.vector_segments import (
    decide_comparison,
    resolve_clamps,
    split_segments,
)

# Widths of the SIMD layer: no SIMD (one lane), SSE/NEON, AVX2, AVX-512. -DKILN_VECTOR_BYTES
# compiles each on this host; GCC splits vectors wider than the host's registers.
WIDTHS = [4, 16, 32, 64]


@pytest.fixture
def cpp(cpp):
    """The vector code path (`CppOptions.vectorize`, the default; KILN_CPP_VECTORIZE=0 opts out)."""
    return cpp.with_options(vectorize=True)


def test_vector_code_is_the_default_and_kiln_cpp_vectorize_0_opts_out(monkeypatch, tmp_path):
    kernel_graph = loopir.lower(make_fx(lambda x: torch.tanh(x) * 2)(torch.randn(8, 64)))
    monkeypatch.delenv("KILN_CPP_VECTORIZE", raising=False)
    assert codegen_cpp.CppOptions().vectorize
    assert "// vector code" in codegen_cpp.generate(kernel_graph, codegen_cpp.CppOptions(cache_dir=tmp_path))
    monkeypatch.setenv("KILN_CPP_VECTORIZE", "0")
    assert not codegen_cpp.CppOptions().vectorize
    source = codegen_cpp.generate(kernel_graph, codegen_cpp.CppOptions(cache_dir=tmp_path))
    assert "// scalar loop: vectorization is off" in source and "// vector code" not in source


def _pointwise_mix(x, y, flags, n):
    relu = torch.relu(-x)
    gate = torch.where(x > y, torch.exp(x), torch.tanh(y) * 0.5)
    logic = (flags & (x >= 0)) | (y == 0)
    return (x * torch.sigmoid(x) + gate - relu + torch.erf(y), logic, torch.maximum(x, y), torch.minimum(x, y),
            x.abs().sqrt() + x.floor() - y.round(), torch.log1p(x.abs()), torch.expm1(y), n * 3 + 1, n.double() * x.double(),
            torch.where(flags, n, -n), (x * 2).to(torch.int32), x.pow(2) - y.rsqrt())


def _inputs(cols):
    torch.manual_seed(0)
    x, y = torch.randn(5, cols), torch.randn(cols)
    x[0, 0], x[1, 1 % cols], y[0] = float("nan"), float("inf"), -0.0
    return x, y, torch.rand(5, cols) > 0.5, torch.randint(-100, 100, (5, cols))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("cols", [1, 7, 16, 37])
def test_vector_code_matches_eager_at_every_width_and_tail(cpp, width, cols):
    compiled = cpp.with_options(flags=(*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}")).check(
        _pointwise_mix, *_inputs(cols), atol=1e-5, rtol=1e-5)
    assert ("// vector code" in compiled.source) == (cols >= 4)


def _gate(x, y):
    return torch.where(x > y, x.exp(), y.tanh()) - torch.relu(-x)


def test_dynamic_sizes_are_vector_code_with_a_tail(cpp):
    compiled = cpp.check(_gate, *_inputs(37)[:2], tracing_mode="symbolic",
                         calls=[_inputs(3)[:2], _inputs(64)[:2]], atol=1e-5, rtol=1e-5)
    assert "// vector code" in compiled.source and "// the tail: one partial vector" in compiled.source


def test_loop_invariant_values_are_broadcast(cpp):
    compiled = cpp.check(lambda x, s: x * s + 2.0, torch.randn(4, 33), torch.randn(4, 1))
    assert re.search(r"auto tmp\d+ = in_\w+\[i0\];", compiled.source)  # one scalar load per row
    assert "kiln::splat<kiln::vf32>(" in compiled.source


@pytest.mark.parametrize(("fn", "args", "reason"), [
    (lambda x: x[::2] * 2, (torch.randn(64),), "non-contiguous access"),  # 1-D: nothing to tile
    (lambda x, i: x[i] * 2, (torch.randn(64), torch.tensor([3, 1, 4, 1, 59, 2, 6, 5, 3])), "indirect"),  # per lane
    (lambda x: torch.atan(x), (torch.randn(4, 16),), "atan has no vector version"),
])
def test_kernels_that_stay_scalar_say_why(cpp, fn, args, reason):
    compiled = cpp.check(fn, *args)
    assert re.search(rf"// scalar loop: not vectorized: .*{reason}", compiled.source), compiled.source


@pytest.mark.parametrize("width", WIDTHS)
def test_rows_gathered_by_one_index_each_are_vector_code_with_their_bounds_check(cpp, width):
    """An embedding lookup: the index is one value across the lanes (they run along the row),
    so it is wrapped and checked as scalar code and the row is read with vector loads."""
    weight, ids = torch.randn(50, 37), torch.tensor([[3, -1, 49], [0, 7, -49]])
    compiled = cpp.with_options(flags=(*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}")).check(
        lambda i, w: w[i], ids.abs(), weight)  # what embedding decomposes to
    assert "scalar loop" not in compiled.source and "kiln::load(in_" in compiled.source
    assert "kiln_fail" in compiled.source  # the bounds check stays
    wrapped = cpp.check(lambda w, i: w[i] * 2, weight, ids)  # negative indices wrap as eager's
    assert "scalar loop" not in wrapped.source
    with pytest.raises(IndexError, match="out of bounds"):
        compiled.module(torch.tensor([[3, 50, 1], [0, 0, 0]]), weight)


def _permutes(x, y, n, flags):
    return (x.t() + 1, x.t().contiguous() * 2, (x.t().contiguous() + y).t(), n.t().contiguous() - 1,
            flags.t().contiguous() | (x.t() > 0).contiguous())


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("shape", [(5, 7), (37, 19), (64, 40)])
def test_transposes_are_vector_code_in_2d_tiles_or_reordered_loops(cpp, width, shape):
    torch.manual_seed(0)
    x = torch.randn(shape)
    args = (x, torch.randn(shape[::-1]), torch.randint(-9, 9, shape), torch.rand(shape) > 0.5)
    compiled = cpp.with_options(flags=(*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}")).check(_permutes, *args)
    assert "// scalar loop" not in compiled.source, compiled.source
    assert "kiln::load_strided(" in compiled.source and "_tile += 16" in compiled.source


def test_a_permute_of_three_dims_is_vector_code(cpp):
    compiled = cpp.check(lambda x: x.permute(2, 0, 1).contiguous() + 1, torch.randn(6, 20, 36))
    assert "// scalar loop" not in compiled.source and "// vector code" in compiled.source


# -- the regression guard ----------------------------------------------------------------------

# A call of libm (std::exp, expf, ...) or of the scalar prelude (kiln_sigmoid, ...).
_SCALAR_MATH = re.compile(r"(?<![\w:])(std::\w+|kiln_\w+|[a-z]+[0-9]*f?)\(")
_VECTOR_CALLS = {"static_cast"}
# A loop-invariant scalar (`inv<n>`, of scalar operands only: a vector cannot be passed to
# scalar math), computed once per loop where GCC hoists it, then broadcast.
_LOOP_INVARIANT = re.compile(r"\s*auto inv\d+ = ")


def vector_code_lines(source: str) -> list[str]:
    """Every line inside a loop marked `// vector code` (to its matching brace)."""
    inside, depth = [], 0
    for line in source.splitlines():
        if depth == 0 and "// vector code" in line:
            depth = 1
            continue
        if depth:
            depth += line.count("{") - line.count("}")
            if depth > 0:
                inside.append(line)
    return inside


def vector_guard_failures(source: str) -> list[str]:
    """What keeps a kernel's hot loops off the vector layer: loops left scalar, and scalar
    math called inside vector code."""
    failures = [line.strip() for line in source.splitlines() if "// scalar loop:" in line]
    failures += [f"scalar math in vector code: {line.strip()}" for line in vector_code_lines(source)
                 if any(call not in _VECTOR_CALLS for call in _SCALAR_MATH.findall(line))
                 and not _LOOP_INVARIANT.match(line)]
    return failures


def _softmax(x):  # as decomp.loop_level() writes it
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def _layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + 1e-5) * w + b


GUARDED = {
    "relu, where, compares, exp, tanh, sigmoid, erf": (
        lambda x, y: torch.where(x > y, torch.exp(x) * torch.sigmoid(y), torch.tanh(x) - torch.erf(y)) - torch.relu(-x),
        (torch.randn(64, 256), torch.randn(256))),
    "the benchmark's pointwise chain": (
        lambda x: x * torch.sigmoid(x) + torch.tanh(x) * 0.5 - torch.relu(-x), (torch.randn(64, 256),)),
    "gelu (erf) and silu": (lambda x: x * 0.5 * (1 + torch.erf(x * 0.7071067811865476)) + x * torch.sigmoid(x),
                            (torch.randn(64, 256),)),
    "bias add, log1p, expm1, log, sqrt": (
        lambda x, b: torch.log1p(torch.relu(x + b)) + torch.expm1(-x.abs()) + torch.log(x * x + 1).sqrt(),
        (torch.randn(64, 256), torch.randn(256))),
    "gelu (tanh)": (lambda x: 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))),
                    (torch.randn(64, 256),)),
    "rotary sin/cos, exp2, log2, pow": (
        lambda x, y: torch.sin(x) * y + torch.cos(x) + torch.exp2(y) - torch.log2(x.abs() + 1) + x.abs().pow(y),
        (torch.randn(64, 256), torch.randn(64, 256))),
    "float64 chain": (lambda x: torch.exp(x) * torch.sigmoid(x) + torch.tanh(x) - torch.log1p(x.abs()),
                      (torch.randn(64, 256, dtype=torch.float64),)),
}
ROWS = {
    "softmax": (_softmax, (torch.randn(64, 250),)),
    "sum and amax of rows": (lambda x: (x.sum(-1), x.amax(-1), x.double().amin(-1)), (torch.randn(64, 250),)),
    "layer norm": (_layer_norm, (torch.randn(64, 256), torch.randn(256), torch.randn(256))),
    "log softmax": (lambda x: x - x.amax(-1, keepdim=True) - (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True).log(),
                    (torch.randn(64, 250),)),
    "rmsnorm": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                (torch.randn(64, 256), torch.randn(256))),
    "var_mean (two passes)": (lambda x: (((x - x.mean(-1, keepdim=True)) ** 2).sum(-1) / 255, x.mean(-1)),
                              (torch.randn(64, 256),)),
    "argmax, argmin, prod, any": (lambda x: (x.argmax(-1), x.argmin(-1), (x * 0.1 + 1).prod(-1), (x > 2).any(-1)),
                                  (torch.randn(64, 256),)),
    "softmax in bfloat16": (lambda x: _softmax(x.float()).bfloat16(), (torch.randn(64, 250).bfloat16(),)),
    "layer norm in bfloat16": (lambda x, w, b: _layer_norm(x.float(), w.float(), b.float()).bfloat16(),
                               (torch.randn(64, 256).bfloat16(), torch.randn(256).bfloat16(),
                                torch.randn(256).bfloat16())),
    "whole-tensor sum (split across threads)": (lambda x: ((x - 1) ** 2).sum() / x.numel(), (torch.randn(256, 256),)),
}
def _bias_grad_and_transposed(grad, pre):
    masked = torch.where(pre <= 0, 0.0, grad)
    return masked.sum(0), masked.t().contiguous() * 2


# Reductions over an outer (or transposed) dim: vector code across the outputs, no lane fold.
OUTER = {
    "sum and amax over dim 0": (lambda x: (x.sum(0), x.amax(0)), (torch.randn(64, 256),)),
    "mean over a transposed input": (lambda x: x.t().mean(-1), (torch.randn(64, 256),)),
    "batch-norm-like statistics over dims 0 and 2": (lambda x: x.mean((0, 2)), (torch.randn(8, 64, 32),)),
    "mean over dim 0, a loop around the lanes": (lambda x: (x.mean(0) + 1).sqrt(), (torch.rand(16, 8, 64),)),
    "transposed add (2-D tiles)": (lambda x, y: x.t().contiguous() + y, (torch.randn(64, 256), torch.randn(256, 64))),
    "transposed output (loops reordered)": (lambda x: x.t() * 2 + 1, (torch.randn(64, 256),)),
    # a linear layer's backward: the bias gradient (a sum over dim 0) with the transposed
    # gradient as its rows, stored lane by lane
    "sum over dim 0 with transposed rows": (_bias_grad_and_transposed, (torch.randn(40, 100), torch.randn(40, 100))),
}


@pytest.mark.parametrize("name", list(GUARDED))
def test_hot_pointwise_loops_use_the_vector_layer(cpp, name):
    fn, args = GUARDED[name]
    compiled = cpp.check(fn, *args, atol=1e-5, rtol=1e-5)
    assert not vector_guard_failures(compiled.source)
    assert "// vector code" in compiled.source


@pytest.mark.parametrize("row_temporaries", [True, False])
@pytest.mark.parametrize("name", list(ROWS))
def test_hot_row_loops_and_reductions_use_the_vector_layer(cpp, name, row_temporaries):
    fn, args = ROWS[name]
    # bfloat16 results may differ from eager's by one rounding (float sums in another order)
    tolerance = 1e-2 if "bfloat16" in name else 1e-5
    compiled = cpp.check(fn, *args, row_temporaries=row_temporaries, atol=tolerance, rtol=tolerance)
    assert not vector_guard_failures(compiled.source)
    assert "kiln::reduce_" in compiled.source


@pytest.mark.parametrize("name", list(OUTER))
def test_hot_outer_dim_reductions_use_the_vector_layer(cpp, name):
    fn, args = OUTER[name]
    compiled = cpp.check(fn, *args, atol=1e-5, rtol=1e-5)
    assert not vector_guard_failures(compiled.source)
    assert "// vector code" in compiled.source


def _batch_norm_relu(x, running_mean, running_var, w, b, training):  # as kiln's decompositions write it
    channel = (1, -1, 1, 1)
    mean, var = running_mean.view(channel), running_var.view(channel)
    if training:  # batch statistics: reductions over N, H, W, the outer dims of channels-last
        mean = x.mean((0, 2, 3), keepdim=True)
        var = ((x - mean) * (x - mean)).mean((0, 2, 3), keepdim=True)
    return torch.relu((x - mean) * torch.rsqrt(var + 1e-5) * w.view(channel) + b.view(channel))


def _channels_last_batch(channels: int) -> tuple[torch.Tensor, ...]:
    x = torch.randn(8, channels, 14, 14).contiguous(memory_format=torch.channels_last)
    return x, torch.randn(channels), torch.rand(channels) + 0.5, torch.randn(channels), torch.randn(channels)


# The channels-last ConvNet block of the benchmark (`tools/bench.py --suite channels-last`),
# after its convolution: loops in memory order (C innermost), vector code along C.
CHANNELS_LAST = {
    "batch norm + relu, batch statistics": (functools.partial(_batch_norm_relu, training=True), 64),
    "batch norm + relu, running statistics": (functools.partial(_batch_norm_relu, training=False), 64),
    "batch statistics, 67 channels (a tail)": (functools.partial(_batch_norm_relu, training=True), 67),
}


@pytest.mark.parametrize("recompute_cheap", [True, False])
@pytest.mark.parametrize("name", list(CHANNELS_LAST))
def test_hot_channels_last_batch_norm_loops_use_the_vector_layer(cpp, name, recompute_cheap):
    fn, channels = CHANNELS_LAST[name]
    args = _channels_last_batch(channels)
    # the options kiln's backend lowers with for this codegen (its Capabilities)
    compiled = cpp.check(fn, *args, row_temporaries=True, recompute_cheap=recompute_cheap, atol=1e-5, rtol=1e-5)
    source = compiled.source
    assert not vector_guard_failures(source), source
    # the statistics: lanes across the channels, each reducing over N, H, W; no lane fold
    # float32 lanes whose sums move into a float64 total every few rows
    assert ("kiln::vf64x2 vtotal_" in source) == ("batch statistics" in name), source
    assert "kiln::reduce_" not in source, source
    # the normalization: rsqrt(var + eps) once per channel, before the N, H, W loops
    assert "computed before the loops" in source, source
    before_loops = source[:source.rindex("#pragma omp parallel for")]
    assert "kiln::rsqrt(" in before_loops and "kiln::rsqrt(" not in source[len(before_loops):], source
    # every loop nest with work to share is parallel, none over a dim of size 1
    assert "< 1;" not in source, source


def test_row_reductions_keep_eager_nan_semantics(cpp):
    x = torch.randn(6, 37)
    x[1, 5], x[2, 36], x[3, :] = float("nan"), float("nan"), float("-inf")
    compiled = cpp.check(lambda x: (x.amax(-1), x.amin(-1), x.sum(-1)), x)
    assert "kiln::reduce_max" in compiled.source


@pytest.mark.parametrize("width", WIDTHS)
def test_float32_sums_add_at_most_a_bounded_run_in_float32(cpp, cpp_parallel, width):
    """The stated accuracy of vector float32 sums: float32 lanes, each lane's partial sum moved
    into a float64 total after at most FLUSH_BLOCKS + PARTS values (the hot loop adds without
    conversion), the total rounded once. A large value followed by ones is the worst case of a
    float32 accumulator: the lane holding 2**25 drops every 1.0 added to it (ulp 4) until its
    flush, so at most FLUSH_BLOCKS + PARTS - 1 of them are lost, whatever the row's length (a
    single float32 accumulator per lane loses length / lanes). Eager's cascade sum loses 16
    per row here. Sums over outer dims (lanes across the outputs, one accumulator per lane) add
    runs of at most LANEWISE_RUN values in float32: a short innermost loop whole, a long one
    cut into runs (plus, in every case, the final rounding to float32)."""
    length = 65537
    rounding = 2  # the final rounding to float32: half an ulp at 2**25
    big = torch.full((2, length), 1.0)
    big[:, 0] = 2.0 ** 25
    exact = 2.0 ** 25 + length - 1
    flags = (*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}")
    row = cpp.with_options(flags=flags).check(lambda y: y.sum(-1), big, atol=16, rtol=0)
    assert "kiln::vf64x2 vtotal_" in row.source and "kiln::widen2(" not in row.source.split("vector code, 4")[1].split("}")[0]
    whole = cpp_parallel.with_options(flags=flags).check(lambda y: y.sum(), big, atol=32, rtol=0)
    assert "split in 64 chunks" in whole.source
    for result, expected, rows in [(row.module(big)[0], exact, 1), (whole.module(big), 2 * exact, 2)]:
        lost = expected - result.double()
        assert (0 <= lost).all() and (lost <= rows * (FLUSH_BLOCKS + PARTS - 1) + rounding).all(), (lost, result)
    # sums over outer dims (lanes across the outputs): float32 runs of a short innermost loop
    # (at most LANEWISE_RUN values), or of LANEWISE_RUN iterations of a long one
    planes = torch.ones(256, LANEWISE_RUN, 64)
    planes[0, 0] = 2.0 ** 25
    short = cpp.with_options(flags=flags).check(lambda y: y.sum((0, 1)), planes, atol=64, rtol=0)
    columns = torch.ones(length, 64)
    columns[0] = 2.0 ** 25
    long = cpp.with_options(flags=flags).check(lambda y: y.sum(0), columns, atol=16, rtol=0)
    assert "kiln::vf32 vacc_" in short.source and "kiln::vf32 vacc_" in long.source
    assert f"r0_run += {LANEWISE_RUN})" in long.source and "_run +=" not in short.source
    for compiled, inputs, expected, bound in [(short, planes, 2.0 ** 25 + 256 * LANEWISE_RUN - 1, LANEWISE_RUN - 1),
                                             (long, columns, exact, LANEWISE_RUN - 1)]:
        lost = expected - compiled.module(inputs)[0].double()
        assert (0 <= lost).all() and (lost <= bound + rounding).all(), lost
    if width != WIDTHS[-1]:
        return
    # ones alone (partials of at most 12 values each) stay exact far beyond float32's 2**24
    ones = torch.ones(1, 2 ** 25 + 4098)
    assert cpp.with_options(flags=flags).build(lambda y: y.sum(-1), ones).module(ones)[0] == 2.0 ** 25 + 4098


def _short_row_sum_bound(lanes: int) -> int:
    """Float32 additions a value goes through in a short row's sum (vector_reduction_source.py):
    its partial, the tree of the PARTS partials, the total (flushes), the tree of the lanes."""
    return FLUSH_BLOCKS + 2 + (SHORT_ROW // (PARTS * FLUSH_BLOCKS) + 1) + (lanes.bit_length() - 1)


@pytest.mark.parametrize("width", WIDTHS)
def test_short_float32_rows_sum_into_a_float32_total(cpp, cpp_parallel, width):
    """A float32 row sum of static length n keeps a float32 total where n <= SHORT_ROW *
    KILN_LANES (decided in C++ per ISA), a float64 one past it. Which one ran shows in the
    results: on rows of integers below 2**18 every float32 partial (at most 32 values once
    folded) is exact, so a float64 total gives the exact sum rounded once, while a float32
    total (past 2**24) rounds along the way. Either way the error stays within the stated bound,
    (19 + log2 KILN_LANES) * u * sum(|x|), on a large value then ones and on random values."""
    lanes = width // 4
    flags = (*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}")
    u = 2.0 ** -24
    for length in sorted({1024, SHORT_ROW * lanes, SHORT_ROW * lanes + 1}):
        float32_total = length <= SHORT_ROW * lanes
        torch.manual_seed(length)
        integers = torch.randint(0, 2 ** 18, (16, length)).float()
        big = torch.ones(16, length)
        big[:, 0] = 2.0 ** 25
        normal = torch.randn(16, length) * 100 + 1
        compiled = cpp.with_options(flags=flags).build(lambda y: y.sum(-1), integers)
        source = compiled.source
        if length <= SHORT_ROW * MAX_LANES:  # the total's type is C++'s choice
            assert f"kiln::sum_total<({length} <= {SHORT_ROW} * KILN_LANES)> vtotal_" in source, source
        else:
            assert "kiln::vf64x2 vtotal_" in source and "kiln::sum_total<" not in source, source
        for inputs in (integers, big, normal):
            exact = inputs.double().sum(-1)
            result = compiled.module(inputs).double()
            bound = _short_row_sum_bound(lanes) * u * inputs.double().abs().sum(-1)
            assert ((result - exact).abs() <= bound).all(), (length, (result - exact).abs().max())
        rounded_once = compiled.module(integers) == integers.double().sum(-1).float()
        assert rounded_once.all() != float32_total, (length, rounded_once)
        if not float32_total:  # the float64 total's own bound: only partials round
            result = compiled.module(big).double()
            lost = 2.0 ** 25 + length - 1 - result
            assert ((0 <= lost) & (lost <= FLUSH_BLOCKS + PARTS - 1 + 2)).all(), lost
    # a whole short tensor split across threads: each chunk's total, chunks combined in float64
    values = torch.randint(0, 2 ** 18, (1000,)).float()
    whole = cpp_parallel.with_options(flags=flags).build(lambda y: y.sum(), values)
    assert "split in 64 chunks" in whole.source and "kiln::sum_total<(1000 <= " in whole.source
    error = abs(whole.module(values).double() - values.double().sum())
    assert error <= (_short_row_sum_bound(lanes) + 1) * u * values.double().sum(), error


def test_float32_sums_of_unknown_length_or_several_dims_keep_a_float64_total(cpp):
    x = torch.randn(4, 3, 40)
    symbolic = cpp.check(lambda y: y.sum(-1), x[0], tracing_mode="symbolic", calls=[(torch.randn(5, 70),)],
                         atol=1e-5, rtol=1e-5)
    assert "kiln::vf64x2 vtotal_" in symbolic.source and "kiln::sum_total<" not in symbolic.source
    dims = cpp.check(lambda y: y.sum((0, 2)), x.transpose(0, 1), atol=1e-5, rtol=1e-5)
    assert "kiln::sum_total<" not in dims.source, dims.source


def test_the_guard_catches_a_scalar_loop_and_scalar_math():
    assert vector_guard_failures("    // scalar loop: not vectorized: sin has no vector version\n")
    source = "for (...) {  // vector code\n    auto tmp1 = std::exp(tmp0);\n}\n"
    assert vector_guard_failures(source) == ["scalar math in vector code: auto tmp1 = std::exp(tmp0);"]
    assert not vector_guard_failures(source.replace("std::exp", "kiln::exp"))
    assert not vector_guard_failures(source.replace("auto tmp1 = std::exp(tmp0)", "auto inv1 = std::exp(inv0)"))
    nested = "for (...) {  // vector code, 4 accumulators\n    {\n        x;\n    }\n    {\n        y = expf(x);\n    }\n}\n"
    assert vector_guard_failures(nested) == ["scalar math in vector code: y = expf(x);"]


def _host_has(flag: str) -> bool:
    try:
        return flag in open("/proc/cpuinfo").read().split()
    except OSError:
        return False


@pytest.mark.skipif(not _host_has("avx2") or not _host_has("fma"), reason="reads x86 AVX2/FMA assembly")
@pytest.mark.parametrize("name", ["the benchmark's pointwise chain", "gelu (erf) and silu"])
def test_vector_loops_compile_to_packed_fma_code_without_calls(tmp_path, name):
    """The assembly of the hot loops (deterministic, unlike a timing): packed arithmetic, fused
    multiply-adds, and no call at all (no libm, no outlined helper) in the kernel."""
    fn, args = GUARDED[name]
    options = codegen_cpp.CppOptions(cache_dir=tmp_path, vectorize=True, openmp=False)
    source = codegen_cpp.generate(loopir.lower(make_fx(fn)(*args)), options)
    asm = subprocess.run([options.compiler, *options.flags, "-fopenmp-simd", "-S", "-o", "-", "-x", "c++", "-"],
                         input=source, capture_output=True, text=True, check=True).stdout
    kernel = asm[asm.index("kernel0:"):]
    kernel = kernel[:kernel.index(".cfi_endproc")]
    instructions = [line.split()[0] for line in kernel.splitlines() if line.startswith("\t") and line.split()
                    and not line.startswith("\t.")]
    assert "call" not in instructions
    assert any(i.startswith("vfmadd") or i.startswith("vfnmadd") for i in instructions)
    packed = [i for i in instructions if re.fullmatch(r"v\w+p[sd]", i)]
    assert len(packed) > 30, instructions


# -- clamped indices: the vector loop split into segments (vector_segments.py) -------------------

def _rotary(x, cos, sin):  # Hugging Face Llama's apply_rotary_pos_emb on a [batch, seq, heads, dim] view
    q = x.transpose(1, 2)
    half = q.shape[-1] // 2
    return q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin


SEGMENTED = {
    "rotary embedding": (_rotary, lambda d: (torch.randn(2, 8, 3, d), torch.randn(1, 1, 8, d), torch.randn(1, 1, 8, d))),
    "cat of three pieces": (lambda x, y: torch.cat((x * 2, y.exp(), -x), dim=-1),
                            lambda d: (torch.randn(6, d), torch.randn(6, d + 3))),
    "constant pad": (lambda x: torch.nn.functional.pad(x, (3, 5), value=-1.0) * 2, lambda d: (torch.randn(6, d),)),
}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("dim", [64, 38])
@pytest.mark.parametrize("name", list(SEGMENTED))
def test_clamped_indices_split_the_vector_loop_into_contiguous_segments(cpp, name, dim, width):
    fn, make_args = SEGMENTED[name]
    torch.manual_seed(0)
    compiled = cpp.with_options(flags=(*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}")).check(
        fn, *make_args(dim), atol=1e-6, rtol=1e-6)
    assert not vector_guard_failures(compiled.source)
    # the innermost (contiguous) dim is the vector loop, split where the clamps change branch:
    # no lane-by-lane loads along a short outer dim, no selects between both branches
    assert re.search(r"// vector code, i\d in \[0, \d+\)", compiled.source), compiled.source
    assert "kiln::load_strided(" not in compiled.source and "kiln::select(" not in compiled.source


def test_resolve_clamps_decides_each_segment_and_names_where_to_split():
    i, j = sympy.symbols("i3 i2", integer=True)
    index = 64 * j + sympy.Min(31, sympy.Max(0, i - 32))
    assert resolve_clamps(index, i, 0, 64) == (index, {32})  # undecided over [0, 64): split at 32
    assert resolve_clamps(index, i, 0, 32) == (64 * j, set())
    assert resolve_clamps(index, i, 32, 64) == (64 * j + i - 32, set())
    assert resolve_clamps(sympy.Min(31, i) + 32, i, 0, 32) == (i + 32, set())
    assert resolve_clamps(sympy.Min(j, i), i, 0, 8)[1] == set()  # not decidable by i alone: no split
    assert split_segments([(0, 64)], {32, 70}) == [(0, 32), (32, 64)]
    assert decide_comparison("lt", i, sympy.Integer(32), i, 0, 32) == (True, set())
    assert decide_comparison("lt", i, sympy.Integer(32), i, 32, 64) == (False, set())
    assert decide_comparison("lt", i, sympy.Integer(32), i, 0, 64) == (None, {32})
    assert decide_comparison("le", i - 3, sympy.Integer(63), i, 3, 72) == (None, {67})
    assert decide_comparison("eq", i, sympy.Integer(40), i, 32, 64) == (None, set())
