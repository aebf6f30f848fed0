"""Differential tests of pointwise kernels: generated Triton vs eager (on the Triton
interpreter, or compiled for a GPU: see conftest.py). Each op on torch's OpInfo samples, in
every dtype, is the table of integration/tests/test_integration_op_table.py; here are fusion,
layouts, dynamic shapes, and the special values (NaN, inf, signed zeros, integer signs,
out-of-range shifts) and constants OpInfo's samples do not hold."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonCodegenError, TritonOptions, compile, verify
from kiln.loopir import lower

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    # A small xblock so tensors span several programs and the last one is partly masked.
    return TritonOptions(cache_dir=tmp_path_factory.mktemp("triton_cache"), xblock=16)


def compile_fn(fn, args, options, tracing_mode="real"):
    kernel_graph = lower(make_fx(fn, tracing_mode=tracing_mode)(*args), fuse_rows=False)
    module = compile(kernel_graph, options)
    verify(module)
    return module, kernel_graph


def check(fn, args, options, tracing_mode="real", **tolerances):
    module, kernel_graph = compile_fn(fn, args, options, tracing_mode)
    _first = module(*args)  # compiles; on a GPU the call below launches through the direct launcher
    expected, got = fn(*args), module(*args)  # `_first` alive: fresh output memory
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, equal_nan=True, **tolerances)
    return module, kernel_graph


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def test_expm1_log1p_near_zero(options):
    """No cancellation for tiny x (OpInfo's samples hold none)."""
    x, y = randn(7, 9), randn(7, 9)
    check(lambda x, y: (torch.expm1(x * 1e-6), torch.log1p(y * 1e-6)), (x, y), options)


def test_pow_by_special_constant_exponents(options):
    """Exponents the codegen expands into multiplies and roots (2, 3, -1, 0.5) and a general one."""
    x = randn(7, 9)
    check(lambda x: (x**2, x**3, (x.abs() + 1) ** -1, x.abs() ** 0.5, x.abs() ** 2.5), (x,), options)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_chain_is_one_kernel_with_one_store(dtype, options):
    def fn(x, y, z):
        return torch.sigmoid(x) * y + z * 0.1

    module, kernel_graph = check(fn, tuple(randn(5, 6, dtype=dtype) for _ in range(3)), options)
    assert len(kernel_graph.kernels) == 1
    source = module.meta["kiln_triton"].source
    assert source.count("tl.store(") == 1  # intermediates stay in registers
    assert source.count("tl.load(") == 3


def test_float64_constants_keep_double_precision(options):
    x = randn(33, dtype=torch.float64)
    # A float32 constant would be off by ~1e-8 relative; a GPU may fuse the multiply-add (1 ulp).
    check(lambda x: x * 0.1 + 1e-9, (x,), options, rtol=1e-15, atol=0)


def test_broadcasting(options):
    def fn(x, row, col, scalar):
        return x * row + col - scalar

    check(fn, (randn(4, 5, 6), randn(6), randn(5, 1), randn(())), options)


def test_views(options):
    def fn(x, y):
        a = x.t() + y  # strided view of an input
        b = x[:, 1:4] * 2  # slice: offset and stride
        c = x.unsqueeze(0).expand(3, -1, -1) + 1  # expand: zero strides
        d = (x + 1).t().reshape(-1)  # view of a non-contiguous lazy value: // and %
        e = x.select(1, 2) - y.select(0, 1)
        return a, b, c, d, e

    check(fn, (randn(5, 6), randn(6, 5)), options)


def test_non_contiguous_input(options):
    x = randn(6, 5).t()
    module, _ = check(lambda x: x * 2 + 1, (x,), options)
    y = x.contiguous()
    torch.testing.assert_close(module(y), y * 2 + 1)  # the module's layout guard copies
    kernel = next(n.target for n in module.graph.nodes if type(n.target).__name__ == "TritonKernel")
    with pytest.raises(TritonCodegenError, match="strides"):
        kernel(y)


def test_nan_propagation(options):
    x = torch.tensor([1.0, float("nan"), 3.0, -1.0, float("nan")])
    y = torch.tensor([float("nan"), 2.0, 1.0, -2.0, float("nan")])
    check(lambda x, y: (torch.maximum(x, y), torch.minimum(x, y), torch.relu(x)), (x, y), options)


def test_tanh_accuracy_over_its_range(options):
    values = [-30.0, -3.0, -0.5, -0.13, -0.12, -1e-3, -1e-9, 0.0, 1e-9, 1e-3, 0.12, 0.13, 0.5, 3.0, 30.0]
    check(torch.tanh, (torch.tensor(values, dtype=torch.float32),), options)
    check(torch.tanh, (torch.tensor(values, dtype=torch.float64),), options, rtol=1e-14, atol=0)


def test_pow_with_tensor_exponent_special_cases(options):
    base = torch.tensor([2.0, -2.0, -2.0, 0.0, 0.0, 0.0, 1.0, -1.5, float("nan"), 3.0, 4.0])
    exponent = torch.tensor([3.0, 3.0, 2.0, 0.0, 2.0, -1.0, float("nan"), 0.5, 0.0, -2.0, 0.5])
    check(torch.pow, (base, exponent), options)


def test_dynamic_shapes_one_compile_many_sizes(options):
    def fn(x, y):
        return torch.sigmoid(x) * y.t() + 1

    module, kernel_graph = compile_fn(fn, (randn(4, 5), randn(5, 4)), options, tracing_mode="symbolic")
    assert kernel_graph.kernels[0].symbols  # sizes are kernel arguments, not constants
    for rows, cols in [(4, 5), (7, 3), (1, 9), (17, 2)]:
        x, y = randn(rows, cols), randn(cols, rows)
        torch.testing.assert_close(module(x, y), fn(x, y))


def test_empty_tensor_launches_nothing(options):
    x = randn(0, 5)
    check(lambda x: x * 2, (x,), options)


def test_constant_only_kernel(options):
    def fn(x):
        return torch.full((3, 4), 2.5), x + 1

    check(fn, (randn(2),), options)


def specials(shape, dtype):
    """Random values with NaN, +-inf, +-0, 1 and -1.5 planted."""
    x = torch.randn(shape, dtype=dtype) * 3
    values = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.5]
    x.view(-1)[:len(values)] = torch.tensor(values, dtype=dtype)
    return x


def math_unary(x, unit):
    out = [getattr(torch.ops.aten, name)(x) for name in (
        "sin", "cos", "tan", "atan", "sinh", "cosh", "asinh", "erfc", "lgamma", "exp2", "log2", "log10", "ceil",
        "floor", "trunc", "round", "sign", "isnan", "isinf", "signbit")]
    out += [getattr(torch.ops.aten, name)(unit) for name in ("asin", "acos", "atanh", "erfinv")]
    return (*out, torch.acosh(x.abs() + 1), torch.round(x, decimals=2), torch.round(x * 100, decimals=-1))


def math_binary(x, y, row):
    return (torch.atan2(x, y), torch.hypot(x, row), torch.copysign(x, y), torch.copysign(x, -2.0),
            torch.nextafter(x, y), torch.fmax(x, y), torch.fmin(x, row), torch.fmod(x, y), torch.fmod(x, 1.5),
            torch.remainder(x, y), torch.remainder(x, -1.5), torch.div(x, y, rounding_mode="floor"),
            torch.div(x, row, rounding_mode="trunc"), torch.div(x, -0.3, rounding_mode="floor"), 2.0 ** x,
            torch.ldexp(x, torch.tensor([3, -2, 0, 1, 5, 2, 1, 0, -1])), torch.logical_and(x, y),
            torch.logical_or(x, row), torch.logical_xor(x, y))


def math_int(x, y, shift):
    return (torch.div(x, y, rounding_mode="floor"), torch.div(x, y, rounding_mode="trunc"),
            torch.div(x, -4, rounding_mode="floor"), torch.remainder(x, y), torch.remainder(x, -4), torch.fmod(x, y),
            torch.fmod(x, 3), torch.fmax(x, y), torch.fmin(x, y), torch.sign(x), torch.ceil(x), torch.isnan(x),
            torch.isinf(x), torch.signbit(x), x & y, x & 6, x | y, x | 5, x ^ y, ~x,
            torch.bitwise_left_shift(x, shift), torch.bitwise_right_shift(x, shift), (x > 0) & (y > 0),
            (x > 0) ^ True, ~(x > 0), torch.logical_xor(x, y > 0), torch.exp2(x), torch.atan2(x, y), torch.gcd(x, y),
            torch.gcd(x, x * 0), torch.lcm(x, y), torch.lcm(x * 0, y * 0), torch.gcd(x, torch.tensor(12, dtype=x.dtype)))


def _nonzero_ints(shape, dtype):
    x = torch.randint(1, 9, shape, dtype=dtype)
    return torch.where(torch.rand(shape) > 0.5, x, -x)


MATH = {
    "unary": (math_unary, lambda dt: (specials((5, 9), dt), torch.cat([
        torch.tensor([1.0, -1.0, 1.5, float("nan")]), torch.rand(41) * 1.98 - 0.99]).view(5, 9).to(dt))),
    "binary": (math_binary, lambda dt: (specials((5, 9), dt), specials((5, 9), dt).flip(1), specials((9,), dt))),
    "int": (math_int, lambda dt: (torch.randint(-40, 40, (4, 8), dtype=dt), _nonzero_ints((4, 8), dt),
                                  torch.tensor([-1, 0, 1, 3, 31, 32, 63, 64], dtype=dt))),
}


@pytest.mark.parametrize(("group", "dtype"), [("unary", torch.float32), ("unary", torch.float64),
                                              ("binary", torch.float32), ("binary", torch.float64),
                                              ("int", torch.int64), ("int", torch.int32)])
def test_math_matches_eager(group, dtype, options):
    """libm-style math, rounding, Python-style division and remainder, logical and bitwise ops,
    on NaN/inf/signed zeros and on negative integers."""
    fn, inputs = MATH[group]
    check(fn, inputs(dtype), options)


def indexing(x, y, i, rows):
    aten = torch.ops.aten
    return (torch.cat([x, y * 2, x[:, :1]], 1), aten.constant_pad_nd(x, [1, 2, -1, 1], 3), torch.flip(x * 2, [0, 1]),
            torch.arange(2, 11, 3), torch.arange(0.5, 3.0, 0.25), torch.index_select(x, 1, i.abs()),
            torch.gather(x, 1, rows.view(3, 1)), x[rows, i[:3]], x[:, i], x[i[:1]],
            aten.slice_scatter(x, y, 1, 1, None, 2), aten.select_scatter(x, y[:, 0], 1, -1),
            x.diagonal(1) * 2, (x + 1).unfold(1, 2, 1), aten.diagonal_scatter(x, y[:2, 0], -1),
            torch.where(x == x, x, aten.empty_strided([3, 4], [1, 3], dtype=x.dtype, device=x.device)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_indexing_matches_eager(dtype, options):
    """Selections on index predicates (loads clamped in bounds) and indirect loads (masked by
    their loop's masks), negative indices wrapping."""
    args = (torch.randn(3, 4).to(dtype) * 5, torch.randn(3, 2).to(dtype) * 5, torch.tensor([1, -1, 0, 3]),
            torch.tensor([2, 0, 2]))
    check(indexing, args, options)


def test_indirect_loads_in_reductions(options):
    def fn(x, i):
        picked = torch.gather(x, 1, i)  # read inside the reduction loop: masked by xmask & rmask
        shifted = picked - picked.amax(1, keepdim=True)
        return picked.sum(1), x[i[:, 0] % 5].amax(1), shifted.exp() / shifted.exp().sum(1, keepdim=True)

    x, i = torch.randn(5, 37), torch.randint(0, 37, (5, 37))
    check(fn, (x, i), options)
    rows = lower(make_fx(fn)(x, i))  # softmax's pointwise work as row loops, gathering in each
    assert any(k.is_row(n) for k in rows.kernels for n in k.nodes)
    torch.testing.assert_close(compile(rows, options)(x, i), fn(x, i))
