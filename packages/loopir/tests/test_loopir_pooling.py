"""Window reductions on loopir's reference evaluator, against eager: avg/max pooling (1-3d: kernel
sizes, strides, padding, dilation, ceil_mode, count_include_pad, divisor_override), adaptive
pooling, nearest upsampling, and the backward ops of each, as gathers (no scatter)."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import LoweringError, lower, verify

aten = torch.ops.aten


def _x(shape, dtype=torch.float32, seed=0, memory_format=torch.contiguous_format):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen) * 3
    x = x.round() if dtype == torch.int64 else x
    return x.to(dtype).contiguous(memory_format=memory_format)


def _check(fn, *args, dtype=torch.float32, holds="pool|upsample"):
    """Lower `fn` traced on `args` (its graph holds an op whose name matches `holds`); its
    kernels must compute every value (no extern) and match eager: values, dtypes, NaN
    positions, and exact integer indices."""
    gm = make_fx(fn)(*args)
    assert any(re.search(holds, str(n.target)) for n in gm.graph.nodes), gm.code
    kg = lower(gm)
    verify(kg)
    assert kg.kernels and not kg.externs
    got, want = kg(*args), fn(*args)
    tolerances = {}
    if dtype == torch.bfloat16:
        # loopir sums in float32 and rounds once; eager's bfloat16 backward kernels round each
        # addition: a few units in the last place of the largest value
        largest = max(float(t.detach().float().nan_to_num(posinf=0, neginf=0).abs().max()) for t in _leaves(want))
        tolerances = {"rtol": 1.6e-2, "atol": 2 ** -6 * largest}
    torch.testing.assert_close(got, want, equal_nan=True, **tolerances)
    return kg


def _leaves(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _grad_check(op_fn, x, dtype=torch.float32):
    """The backward of `op_fn` at `x` (its first output), as the ATen backward op autograd records,
    for a random output gradient."""
    out = op_fn(x)
    out = out[0] if isinstance(out, tuple) else out
    grad = _x(out.shape, dtype, seed=1)

    def backward(grad, x):
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            out = op_fn(x)
            out = out[0] if isinstance(out, tuple) else out
            return torch.autograd.grad(out, x, grad)[0]

    return _check(backward, grad, x, dtype=dtype, holds="_backward")


# --------------------------------------------------------------------------- avg pooling

AVG_2D = [
    # kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    (2, None, 0, False, True, None),
    (3, 2, 1, False, True, None),
    (3, 2, 1, True, False, None),
    ((3, 2), (2, 1), (1, 0), True, True, None),
    ((2, 4), (3, 2), (1, 2), True, False, None),
    (3, 1, 1, False, True, 4),
    (5, 3, 2, True, True, None),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("params", AVG_2D, ids=str)
def test_avg_pool2d(params, dtype):
    k, s, p, ceil, include, divisor = params
    x = _x((2, 3, 11, 9), dtype)
    _check(lambda x: F.avg_pool2d(x, k, s, p, ceil, include, divisor), x, dtype=dtype)
    if dtype.is_floating_point:
        _grad_check(lambda x: F.avg_pool2d(x, k, s, p, ceil, include, divisor), x, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # eager's avg_pool3d has no bfloat16 kernel
@pytest.mark.parametrize("params", [(3, 2, 1, True, False, None), ((2, 3, 2), (1, 2, 2), (1, 1, 0), True, True, None),
                                    (2, None, 0, False, True, 3)], ids=str)
def test_avg_pool3d(params, dtype):
    k, s, p, ceil, include, divisor = params
    x = _x((2, 2, 7, 6, 9), dtype)
    _check(lambda x: F.avg_pool3d(x, k, s, p, ceil, include, divisor), x, dtype=dtype)
    _grad_check(lambda x: F.avg_pool3d(x, k, s, p, ceil, include, divisor), x, dtype=dtype)


@pytest.mark.parametrize("params", [(3, 2, 1, True, False), (4, 4, 2, False, True), (2, 1, 0, True, True)], ids=str)
def test_avg_pool1d_and_unbatched(params):
    k, s, p, ceil, include = params
    x = _x((3, 4, 13))
    _check(lambda x: F.avg_pool1d(x, k, s, p, ceil, include), x)
    _grad_check(lambda x: F.avg_pool1d(x, k, s, p, ceil, include), x)
    _check(lambda x: F.avg_pool2d(x, k, s, p, ceil, include), x)  # [C, H, W]: no batch dim


def test_avg_pool_of_a_lazy_value_reads_it_from_a_buffer_when_windows_overlap():
    def nodes(kg):
        return [[(type(n.body).__name__, n.origins) for n in k.nodes] for k in kg.kernels]

    x = _x((2, 3, 8, 8))
    overlapping = _check(lambda x: F.avg_pool2d(torch.sigmoid(x) * 2, 3, 1, 1), x)
    disjoint = _check(lambda x: F.avg_pool2d(torch.sigmoid(x) * 2, 2), x)
    pooled = [("Reduction", ("avg_pool2d",)), ("Pointwise", ("avg_pool2d",))]  # the sum, then the division
    assert nodes(overlapping) == [[("Pointwise", ("mul",))], pooled]  # sigmoid * 2 computed once per element
    assert nodes(disjoint) == [pooled]  # each element read once: sigmoid * 2 inlined into the sum


# --------------------------------------------------------------------------- max pooling

MAX_2D = [
    # kernel, stride, padding, dilation, ceil_mode
    (2, None, 0, 1, False),
    (3, 2, 1, 1, False),
    (3, 2, 1, 1, True),
    ((3, 2), (2, 1), (1, 1), (1, 2), True),
    (3, 2, 1, 2, True),
    (2, 3, 1, 1, True),
    (4, 1, 2, 1, False),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("params", MAX_2D, ids=str)
def test_max_pool2d_values_and_indices(params, dtype):
    k, s, p, d, ceil = params
    x = _x((2, 3, 10, 11), dtype)
    _check(lambda x: F.max_pool2d(x, k, s, p, d, ceil, return_indices=True), x, dtype=dtype)
    if dtype.is_floating_point:
        _grad_check(lambda x: F.max_pool2d(x, k, s, p, d, ceil), x, dtype=dtype)


@pytest.mark.parametrize("params", [(3, 2, 1, 1, True), ((2, 3, 2), (1, 2, 2), (1, 1, 0), (2, 1, 1), False)],
                         ids=str)
def test_max_pool3d_values_indices_and_backward(params):
    k, s, p, d, ceil = params
    x = _x((2, 2, 7, 6, 9))
    _check(lambda x: F.max_pool3d(x, k, s, p, d, ceil, return_indices=True), x)
    _grad_check(lambda x: F.max_pool3d(x, k, s, p, d, ceil), x)


@pytest.mark.parametrize("params", [(3, 2, 1, 1, True), (2, 2, 0, 3, False)], ids=str)
def test_max_pool1d(params):
    k, s, p, d, ceil = params
    x = _x((3, 4, 17))
    _check(lambda x: F.max_pool1d(x, k, s, p, d, ceil, return_indices=True), x)
    _grad_check(lambda x: F.max_pool1d(x, k, s, p, d, ceil), x)


def _special(shape, seed=0):
    """Values with NaNs (several in a window), -inf (whole windows of it) and ties."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).round()
    pick = torch.rand(shape, generator=gen)
    x = torch.where(pick < 0.15, float("nan"), x)
    x = torch.where((pick > 0.5) & (pick < 0.8), -float("inf"), x)
    x[..., :5, :] = -float("inf")  # windows in the first rows hold nothing larger
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("params", [(3, 1, 1, 1, False), (3, 2, 1, 2, True), (4, 3, 2, 1, True)], ids=str)
def test_max_pool_takes_the_last_nan_the_first_tie_and_the_first_element_of_a_lowest_window(params, dtype):
    k, s, p, d, ceil = params
    x = _special((2, 3, 9, 10)).to(dtype)
    kg = _check(lambda x: F.max_pool2d(x, k, s, p, d, ceil, return_indices=True), x, dtype=dtype)
    values, indices = kg(x)
    assert values.isnan().any() and (values == -float("inf")).any()  # the cases are exercised
    _grad_check(lambda x: F.max_pool2d(x, k, s, p, d, ceil), x, dtype=dtype)
    _check(lambda x: F.adaptive_max_pool2d(x, (4, 3), return_indices=True), x, dtype=dtype)


def test_max_pool_is_one_kernel_reading_the_input_from_memory():
    kg = _check(lambda x: F.max_pool2d(torch.relu(x), 3, 2, 1, return_indices=True), _x((2, 3, 9, 9)))
    assert len(kg.kernels) == 2  # relu realized once (two reductions read it), then one pooling kernel
    # the max, where it is (reading the max where it was stored), and the index of the last NaN
    assert [(type(n.body).__name__, getattr(n.body, "reduction_type", None)) for n in kg.kernels[1].nodes] == \
        [("Reduction", "max"), ("Reduction", "min"), ("Pointwise", None)]


def test_channels_last_inputs_and_outputs():
    x = _x((2, 5, 8, 7), memory_format=torch.channels_last)
    for fn in (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), lambda x: F.avg_pool2d(x, 3, 2, 1),
               lambda x: F.adaptive_avg_pool2d(x, (3, 5)), lambda x: F.interpolate(x, scale_factor=2)):
        _check(fn, x)
        _grad_check(fn, x)
        kg = lower(make_fx(fn)(x))
        got, want = kg(x), fn(x)
        got, want = (got[0], want[0]) if isinstance(want, tuple) else (got, want)
        assert got.stride() == want.stride()


# --------------------------------------------------------------------------- adaptive pooling

ADAPTIVE = [((9, 10), (4, 5)), ((8, 6), (4, 3)), ((5, 7), (7, 3)), ((6, 6), (1, 1)), ((7, 11), (7, 11))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize(("size", "out"), ADAPTIVE, ids=str)
def test_adaptive_avg_and_max_pool2d(size, out, dtype):
    x = _x((2, 3, *size), dtype)
    _check(lambda x: aten._adaptive_avg_pool2d(x, out), x, dtype=dtype)
    _grad_check(lambda x: aten._adaptive_avg_pool2d(x, out), x, dtype=dtype)
    _check(lambda x: F.adaptive_max_pool2d(x, out, return_indices=True), x, dtype=dtype)
    _grad_check(lambda x: F.adaptive_max_pool2d(x, out), x, dtype=dtype)


@pytest.mark.parametrize(("size", "out"), [((5, 7, 9), (2, 3, 4)), ((4, 4, 6), (4, 2, 3)), ((3, 5, 2), (4, 6, 3))],
                         ids=str)
def test_adaptive_pool3d(size, out):
    x = _x((2, 2, *size))
    _check(lambda x: F.adaptive_avg_pool3d(x, out), x)
    _grad_check(lambda x: F.adaptive_avg_pool3d(x, out), x)
    _check(lambda x: F.adaptive_max_pool3d(x, out, return_indices=True), x)
    _grad_check(lambda x: F.adaptive_max_pool3d(x, out), x)


@pytest.mark.parametrize(("size", "out"), [(13, 4), (6, 6), (5, 9)])
def test_adaptive_pool1d(size, out):
    x = _x((3, 4, size))
    for fn in (lambda x: F.adaptive_avg_pool1d(x, out), lambda x: F.adaptive_max_pool1d(x, out)):
        _check(fn, x)
        _grad_check(fn, x)


# --------------------------------------------------------------------------- nearest upsampling

NEAREST = [
    # input spatial size, size, scale_factor
    ((5, 7), None, 2),
    ((5, 7), (5, 7), None),
    ((5, 7), (13, 4), None),
    ((6, 9), None, (1.7, 0.6)),
    ((6, 9), None, (2.3, 3.0)),
    ((4, 3), (11, 12), None),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize(("size", "out", "scale"), NEAREST, ids=str)
def test_upsample_nearest2d(size, out, scale, mode, dtype):
    x = _x((2, 3, *size), dtype)

    def fn(x):
        return F.interpolate(x, size=out, scale_factor=scale, mode=mode)

    _check(fn, x, dtype=dtype)
    _grad_check(fn, x, dtype=dtype)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize(("shape", "out", "scale"), [((2, 3, 7), 17, None), ((2, 3, 7), None, 2.5),
                                                     ((1, 2, 3, 4, 5), (5, 8, 7), None),
                                                     ((1, 2, 3, 4, 5), None, (2, 1.5, 0.8))], ids=str)
def test_upsample_nearest1d_and_3d(shape, out, scale, mode):
    x = _x(shape)

    def fn(x):
        return F.interpolate(x, size=out, scale_factor=scale, mode=mode)

    _check(fn, x)
    _grad_check(fn, x)


def test_nearest_upsampling_by_two_is_integer_index_math():
    x = _x((2, 3, 5, 6))
    kg = _grad_check(lambda x: F.interpolate(x, scale_factor=2), x)
    text = str(kg)
    assert "floor" not in text and "indirect" not in text and "r0" in text


def test_float_scales_are_read_as_eager_reads_them():
    """With scale_factor 1/3, float32 rounding moves some source indices off floor(o / 3)."""
    x = _x((1, 1, 40, 50))
    kg = _check(lambda x: F.interpolate(x, scale_factor=(1 / 3, 0.7)), x)
    _grad_check(lambda x: F.interpolate(x, scale_factor=(1 / 3, 0.7)), x)
    assert kg.kernels


def test_empty_batches_give_empty_results():
    x = _x((0, 3, 8, 8))
    for fn in (lambda x: F.adaptive_avg_pool2d(x, (5, 3)), lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True),
               lambda x: F.avg_pool2d(x, 3)):
        kg = lower(make_fx(fn)(x))
        got, want = kg(x), fn(x)
        for g, w in zip(_leaves(got), _leaves(want)):
            assert g.shape == w.shape and g.dtype == w.dtype
        assert "FloorDiv" not in str(kg)  # no window math for no element


# --------------------------------------------------------------------------- dynamic shapes and errors


@pytest.mark.parametrize("fn", [
    lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
    lambda x: F.adaptive_avg_pool2d(x, (3, 4)),
    lambda x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True),
], ids=["avg", "max", "adaptive_avg", "adaptive_max"])
def test_symbolic_sizes_lower_once_and_run_at_other_sizes(fn):
    gm = make_fx(fn, tracing_mode="symbolic")(_x((2, 3, 9, 10)))
    kg = lower(gm)
    verify(kg)
    for shape in ((2, 3, 9, 10), (1, 2, 13, 7), (3, 1, 6, 12)):
        x = _x(shape)
        torch.testing.assert_close(kg(x), fn(x), equal_nan=True)


def test_symbolic_backward_of_pooling():
    def backward(grad, x):
        return (aten.avg_pool2d_backward(grad, x, [3, 3], [2, 2], [1, 1], True, False, None),
                aten._adaptive_avg_pool2d_backward(aten._adaptive_avg_pool2d(grad, [3, 4]), x))

    def make(shape):
        x = _x(shape)
        return F.avg_pool2d(x, 3, 2, 1, True, False), x

    kg = lower(make_fx(backward, tracing_mode="symbolic")(*make((2, 3, 9, 10))))
    for shape in ((2, 3, 9, 10), (1, 2, 13, 7)):
        args = make(shape)
        torch.testing.assert_close(kg(*args), backward(*args))


def test_upsample_backward_with_symbolic_sizes_and_scales_names_the_node():
    def backward(grad):
        return aten.upsample_nearest2d_backward(grad, [grad.shape[2], grad.shape[3]],
                                                [1, 1, grad.shape[2] // 3, grad.shape[3] // 3], 3.1, 3.1)

    gm = make_fx(backward, tracing_mode="symbolic")(_x((1, 1, 9, 12)))
    with pytest.raises(LoweringError, match=r"upsample_nearest2d_backward.*symbolic sizes and explicit scales"):
        lower(gm)


GRID = [(k, s, p, ceil) for k, s, p, ceil in itertools.product((1, 2, 3), (1, 2, 3), (0, 1), (False, True))
        if p <= k // 2]


@pytest.mark.parametrize(("k", "s", "p", "ceil"), GRID, ids=str)
def test_grid_of_kernels_strides_paddings_and_ceil_modes_on_odd_sizes(k, s, p, ceil):
    x = _x((1, 2, 7, 5))
    _check(lambda x: F.max_pool2d(x, k, s, p, 1, ceil, return_indices=True), x)
    _check(lambda x: F.avg_pool2d(x, k, s, p, ceil, False), x)
    _grad_check(lambda x: F.avg_pool2d(x, k, s, p, ceil, True), x)
    _grad_check(lambda x: F.max_pool2d(x, k, s, p, 1, ceil), x)
