"""bfloat16/float16 kernels: loads, stores, pointwise math, reductions and row kernels on the
scalar path and the vector layer (which must stay vector code), against loopir's reference
evaluator (the same rounding points: math in float32, one rounding on store) and eager."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, loopir

LOW = [torch.bfloat16, torch.float16]
EPS = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}  # one unit in the last place, relative


@pytest.fixture(params=["scalar", "vector"])
def path(request, cpp):
    return cpp.with_options(vectorize=request.param == "vector")


def _inputs(dtype, cols, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(5, cols, generator=g) * 3).to(dtype)
    y = torch.randn(cols, generator=g).to(dtype)
    if cols > 1:
        x[0, 1], x[1, 0], y[0] = float("nan"), float("inf"), -0.0
    return x, y, torch.randn(5, cols, generator=g)


def _check(builder, fn, *args, exact=(), row_temporaries=False):
    """Compile `fn`; compare with loopir's reference evaluator (within one unit in the last
    place: C++'s float32 libm and torch's may differ by an ulp before the rounding; outputs
    listed in `exact` bit for bit) and the dtypes with eager."""
    compiled = builder.build(fn, *args, row_temporaries=row_temporaries)
    got, reference, eager = compiled.module(*args), compiled.kernel_graph(*args), fn(*args)
    for k, (g, r, e) in enumerate(zip(got, reference, eager)):
        assert g.dtype == r.dtype == e.dtype and g.shape == e.shape, k
        tolerance = dict(rtol=0, atol=0) if k in exact else dict(rtol=EPS.get(g.dtype, 1.3e-6), atol=1e-5)
        torch.testing.assert_close(g, r, equal_nan=True, **tolerance, msg=lambda m, k=k: f"output {k}: {m}")
    return compiled, got


def _pointwise(x, y, f):
    gate = torch.where(x > y, torch.exp(torch.minimum(x, y)), torch.tanh(y) * 0.5)
    return (x * torch.sigmoid(x) + gate,  # bfloat16 math, rounded once
            (x.float() + f).to(x.dtype) * 2,  # mixed with float32
            x.float() * f,  # a float32 result of a low-precision load
            torch.where(x > 0, x, 0.1),  # a constant rounded on store
            -x, x.abs(), torch.maximum(x, y), torch.minimum(x, y), torch.relu(x),  # exact
            x > y, x == y, x.isnan(), (x * 3).to(torch.int32), x.double())


POINTWISE_EXACT = tuple(range(3, 14))


@pytest.mark.parametrize("cols", [1, 7, 16, 37])
@pytest.mark.parametrize("dtype", LOW)
def test_pointwise_loads_math_and_stores(path, dtype, cols):
    x, y, f = _inputs(dtype, cols)
    x = x.clone()
    x[x.float().abs() > 1e4] = 7  # int32 conversion of inf: undefined in eager too
    compiled, got = _check(path, _pointwise, x, y, f, exact=POINTWISE_EXACT)
    assert torch.equal(got[3], torch.where(x > 0, x, 0.1))  # exactly eager's
    vector = path.options.vectorize and cols >= 4
    if vector:  # the conversions are vector code: no 16-bit value falls back to scalar loops
        assert "// scalar loop" not in compiled.source, compiled.source
        assert f"kiln::{'bf16' if dtype == torch.bfloat16 else 'fp16'}_to_f32(kiln::load(" in compiled.source
    else:
        assert "kiln::load(" not in compiled.source and "_to_float(in_" in compiled.source
    # eager rounds after every op; loopir once: close, not equal
    eager = _pointwise(x, y, f)[0]
    torch.testing.assert_close(got[0], eager, rtol=4 * EPS[dtype], atol=1e-3, equal_nan=True)


def test_low_precision_literals_hold_the_rounded_value(path):
    """Eager compares a bfloat16 tensor with 0.1 rounded to bfloat16 (0.10009765625): x == 0.1
    holds for x = bfloat16(0.1)."""
    x = torch.tensor([0.1, 0.1001, 0.09, 0.2]).to(torch.bfloat16).repeat(8)
    compiled, got = _check(path, lambda x: (x > 0.1, x == 0.1), x, exact=(0, 1))
    assert got[1].tolist() == [True, True, False, False] * 8
    assert "static_cast<float>(0.10009765625)" in compiled.source


def _reductions(x):
    return (x.sum(-1), x.amax(-1), x.amin(-1), x.mean(-1), x.sum(), x.amax(0), x.argmax(-1), x.argmin(0),
            x.prod(-1), (x.float() * 2).sum(-1))


@pytest.mark.parametrize("dtype", LOW)
def test_reductions_accumulate_in_float32_and_round_once(path, dtype):
    x = (torch.randn(6, 37, generator=torch.Generator().manual_seed(1)) * 4).to(dtype)
    x[2, 5], x[3, :] = float("nan"), float("-inf")
    compiled, got = _check(path, _reductions, x, exact=(1, 2, 5, 6, 7))
    for k, (g, e) in enumerate(zip(got, _reductions(x))):  # and eager, whose float32 sums go in another order
        torch.testing.assert_close(g, e, rtol=2 * EPS.get(g.dtype, 1e-6), atol=1e-2, equal_nan=True,
                                   msg=lambda m, k=k: f"output {k}: {m}")
    if path.options.vectorize:
        assert "kiln::reduce_add" in compiled.source and "kiln::reduce_max" in compiled.source


def test_low_precision_sums_of_many_terms_do_not_accumulate_in_16_bits(cpp):
    x = torch.ones(3, 4096, dtype=torch.bfloat16)  # a bfloat16 accumulator stops at 256
    assert cpp.build(lambda x: x.sum(-1), x).module(x).tolist() == [4096.0] * 3


def _softmax(x):  # as decomp.loop_level() writes it, on the input's dtype
    xf = x.float()
    e = (xf - xf.amax(-1, keepdim=True)).exp()
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def _layer_norm(x, w, b):
    xf = x.float()
    mean = xf.mean(-1, keepdim=True)
    centered = xf - mean
    var = (centered * centered).mean(-1, keepdim=True)
    return (centered * torch.rsqrt(var + 1e-5) * w.float() + b.float()).to(x.dtype)


def _rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


@pytest.mark.parametrize("row_temporaries", [True, False])
@pytest.mark.parametrize("dtype", LOW)
def test_row_kernels(path, dtype, row_temporaries):
    g = torch.Generator().manual_seed(2)
    x, w, b = (torch.randn(shape, generator=g).to(dtype) for shape in ((9, 67), (67,), (67,)))
    for fn, args in ((_softmax, (x,)), (_layer_norm, (x, w, b)), (_rms_norm, (x, w))):
        compiled, got = _check(path, lambda *a, fn=fn: (fn(*a),), *args, row_temporaries=row_temporaries)
        assert len(compiled.kernel_graph.kernels) == 1
        expected = fn(*(a.double() for a in args))
        torch.testing.assert_close(got[0].double(), expected, rtol=EPS[dtype], atol=2 * EPS[dtype])
        if path.options.vectorize:
            assert "// scalar loop" not in compiled.source and "kiln::reduce_" in compiled.source


@pytest.mark.parametrize("dtype", LOW)
def test_strided_offset_and_expanded_inputs(path, dtype):
    base = torch.randn(12, 40).to(dtype)
    transposed, offset, stepped = base[:8, :8].t(), base[2:, 3:], base[::2, ::3]
    expanded = torch.randn(10, 1).to(dtype).expand(10, 37)

    def f(a, b, c, d):
        return a * 2, b.sum(0), c.relu(), (b + d).amax(1), d.t()

    _check(path, f, transposed, offset, stepped, expanded, exact=(0, 2, 4))


@pytest.mark.parametrize("dtype", LOW)
def test_symbolic_sizes(cpp, dtype):
    def f(x, y):
        return (x * y).sum(-1), torch.sigmoid(x) + y

    x, y, _ = _inputs(dtype, 19)
    compiled = cpp.build(f, x, y, tracing_mode="symbolic")
    for cols in (3, 19, 64):
        x, y, _ = _inputs(dtype, cols, seed=cols)
        for got, expected in zip(compiled.module(x, y), compiled.kernel_graph(x, y)):
            torch.testing.assert_close(got, expected, rtol=EPS[dtype], atol=1e-5, equal_nan=True)


def test_input_of_the_wrong_16_bit_dtype_is_refused(cpp):
    compiled = cpp.build(lambda x: x * 2, torch.randn(4).to(torch.bfloat16))
    with pytest.raises(TypeError, match="must be a CPU torch.bfloat16 tensor, got torch.float16"):
        compiled.module(torch.randn(4).to(torch.float16))


@pytest.mark.parametrize("dtype", LOW)
def test_round_low_precision_rounds_every_op_as_eager(path, dtype):
    """loopir's `round_low_precision` rounds each ATen op's result (to_dtype after each op):
    chains of correctly rounded float32 ops then give eager's bits exactly."""
    def f(x, y):
        return ((x * 3 + y) * 0.7 - x) / (y.abs() + 1)

    g = torch.Generator().manual_seed(3)
    x, y = (torch.randn(4, 67, generator=g).to(dtype) for _ in range(2))
    gm = make_fx(f)(x, y)
    per_op = codegen_cpp.compile(loopir.lower(gm, round_low_precision=True), path.options)
    assert torch.equal(per_op(x, y), f(x, y))
    kernel_graph = loopir.lower(gm)
    once = codegen_cpp.compile(kernel_graph, path.options)(x, y)
    assert torch.equal(once, kernel_graph(x, y))
    # one rounding on store: not eager's bits, but closer to the exact result
    truth = f(x.double(), y.double())
    assert not torch.equal(once, f(x, y))
    assert (once.double() - truth).abs().max() < (f(x, y).double() - truth).abs().max()
