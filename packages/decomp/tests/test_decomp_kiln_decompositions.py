"""The kiln-written decompositions: numerics against eager, opset, and declining calls."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.decomp import LOOP_LEVEL_OPS, check_opset, decompose, loop_level, opset
from kiln.decomp._internal.kiln_decompositions import KILN_DECOMPOSITIONS, kiln_table

aten = torch.ops.aten


def _decomposed(fn, *inputs, mode="fake"):
    gm = make_fx(fn, tracing_mode=mode)(*inputs)
    return decompose(gm, loop_level())


def _check(fn, *inputs, mode="fake", atol=1e-5, rtol=1e-5):
    out = _decomposed(fn, *inputs, mode=mode)
    check_opset(out, LOOP_LEVEL_OPS)
    torch.testing.assert_close(out(*inputs), fn(*inputs), atol=atol, rtol=rtol, equal_nan=True)
    return out


def test_every_kiln_function_is_in_the_table_with_kiln_provenance():
    table = kiln_table()
    ops = {op for fn in KILN_DECOMPOSITIONS for op in fn.decomposes}
    assert set(table) == ops
    assert all(table.provenance(op) == "kiln" for op in table)
    assert not (ops & LOOP_LEVEL_OPS)


@pytest.mark.parametrize(
    "dim, correction, keepdim",
    [(None, None, False), (1, None, False), ([0, 2], 0, True), (-1, 2, True), ([], 1, False)],
)
def test_var_mean_and_var(dim, correction, keepdim):
    x = torch.randn(3, 5, 4, dtype=torch.float64)

    def fn(t):
        var, mean = torch.var_mean(t, dim, correction=correction, keepdim=keepdim)
        return var, mean, torch.var(t, dim, correction=correction, keepdim=keepdim)

    out = _check(fn, x)
    assert aten.var_mean.correction not in opset(out)
    assert aten.var.correction not in opset(out)


@pytest.mark.filterwarnings("ignore::UserWarning")  # eager warns: degrees of freedom <= 0
def test_var_with_too_few_elements_is_inf_or_nan_like_eager():
    x = torch.randn(4, 1)
    _check(lambda t: torch.var(t, 1), x)  # N - correction == 0
    _check(lambda t: torch.var(t, 1, correction=3), x)  # negative


def test_var_half_precision_computes_in_float32():
    x = (torch.randn(6, 64) * 100 + 1000).to(torch.float16)
    out = _check(lambda t: torch.var(t, -1), x, atol=1.0, rtol=2e-3)
    assert out(x).dtype == torch.float16
    assert aten._to_copy.default in opset(out)


def test_var_symbolic_count():
    x = torch.randn(5, 3)
    out = _check(lambda t: torch.var_mean(t, 0), x, mode="symbolic")
    y = torch.randn(9, 3)
    torch.testing.assert_close(out(y), torch.var_mean(y, 0))


def test_layer_norm_uses_kiln_var_mean():
    x = torch.randn(4, 16)
    out = _check(lambda t: torch.nn.functional.layer_norm(t, (16,)), x)
    assert aten.mean.dim in opset(out)


@pytest.mark.parametrize(
    "x, low, high",
    [
        (torch.tensor([-3.0, -0.5, 0.2, 4.0, float("nan")]), -1.0, 1.0),
        (torch.tensor([-3.0, 0.2, 4.0]), None, 1.5),
        (torch.tensor([-3.0, 0.2, 4.0]), 0.0, None),
        (torch.tensor([-3.0, 0.2, 4.0]), 2.0, 1.0),  # min > max: all become max
        (torch.tensor([1, 5, 9]), 2, 6),  # int stays int
        (torch.tensor([1, 5, 9]), 2.5, 6.5),  # int with float bounds promotes
        (torch.tensor([True, False]), 0, 1),  # bool with int bounds promotes to int64
        (torch.tensor([1.0, 2.0], dtype=torch.float16), 1.5, 3),
    ],
)
def test_clamp_scalar_bounds(x, low, high):
    out = _check(lambda t: torch.clamp(t, low, high), x)
    assert out(x).dtype == torch.clamp(x, low, high).dtype
    assert aten.clamp.default not in opset(out)


def test_clamp_tensor_bounds_broadcast_and_promote():
    x = torch.tensor([[1, 5, 9], [0, -4, 3]], dtype=torch.int32)
    low = torch.tensor(0.5, dtype=torch.float64)
    high = torch.tensor([2, 6, 8])
    out = _check(lambda t, lo, hi: torch.clamp(t, lo, hi), x, low, high)
    assert out(x, low, high).dtype == torch.float64
    _check(lambda t, lo: torch.clamp(t, min=lo), torch.randn(3, 4), torch.randn(4))


def test_clamp_family_reaches_the_opset():
    x = torch.randn(32) * 4
    fns = [
        lambda t: torch.nn.functional.hardtanh(t),
        lambda t: torch.nn.functional.relu6(t),
        lambda t: torch.nn.functional.hardsigmoid(t),
        lambda t: t.clamp_min(0.5) + t.clamp_max(-0.5),
    ]
    for fn in fns:
        _check(fn, x)


def test_full_like_and_zeros_like():
    x = torch.randn(3, 4)
    out = _check(lambda t: t + torch.zeros_like(t) + torch.full_like(t, 2.5), x)
    assert aten.full.default in opset(out)
    _check(lambda t: torch.full_like(t, 7, dtype=torch.int64), x)


def test_full_like_of_dense_non_contiguous_input_keeps_its_strides():
    x = torch.randn(4, 3, 2)

    def fn(t):
        return torch.full_like(t.permute(2, 0, 1), 1.5)

    out = _check(fn, x)
    assert aten.full_like.default not in opset(out)
    assert out(x).stride() == fn(x).stride()


def test_full_like_of_non_dense_input_is_left_alone():
    x = torch.randn(4, 6)

    def fn(t):
        return torch.full_like(t[:, ::2], 1.0)

    out = _decomposed(fn, x)
    assert aten.full_like.default in opset(out)  # declined: no full + permute has its strides
    result = out(x)
    assert result.stride() == fn(x).stride()
    torch.testing.assert_close(result, fn(x))


def test_tensor_constant_becomes_clone():
    x = torch.randn(3)
    out = _check(lambda t: t * torch.tensor([1.0, 2.0, 3.0]), x)
    assert aten.lift_fresh_copy.default not in opset(out)


def test_bias_epilogues_turn_addmm_into_mm_and_add():
    def f(bias, x, w, full):
        return (torch.addmm(bias, x, w), torch.nn.functional.linear(x, w.t(), bias),
                torch.addmm(full, x, w, beta=0.5), torch.addmm(full, x, w))

    args = (torch.randn(8), torch.randn(4, 6), torch.randn(6, 8), torch.randn(4, 8))
    gm = make_fx(f, tracing_mode="fake")(*args)
    assert opset(decompose(gm, loop_level()))[aten.addmm.default] == 4  # the default keeps addmm
    table = loop_level(bias_epilogues=True)
    assert aten.addmm.default not in table.kept and table.provenance(aten.addmm.default) == "kiln"
    out = decompose(gm, table)
    check_opset(out, LOOP_LEVEL_OPS)
    ops = opset(out)
    assert ops[aten.mm.default] == 3 and ops[aten.addmm.default] == 1  # beta != 1 stays whole
    torch.testing.assert_close(out(*args), f(*args))


def _norm_calls(x, w, w_last, stats):
    """(name, op, args) of the norms whose statistics a backward reads, on input `x`."""
    return [
        ("layer_norm", aten.native_layer_norm.default, (x, [x.shape[-1]], w_last, None, 1e-5)),
        ("group_norm", aten.native_group_norm.default, (x, w, None, x.shape[0], x.shape[1], x.shape[2], 2, 1e-5)),
        ("batch_norm", aten.native_batch_norm.default, (x, w, w, *stats, True, 0.1, 1e-5)),
        ("batch_norm_functional", aten._native_batch_norm_legit_functional.default,
         (x, w, w, *stats, True, 0.1, 1e-5)),
        ("batch_norm_no_stats", aten._native_batch_norm_legit.no_stats, (x, w, w, True, 0.1, 1e-5)),
    ]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_norm_statistics_have_eagers_dtype_on_each_device(device, dtype):
    """Saved mean/rstd in eager's dtype: float32 on CUDA for low-precision inputs (layer and
    batch norm), the input's on the CPU. The forward that saves them and the backward that
    reads them are traced apart; a differing dtype failed a bf16 BERT training step on an H200
    ("input must be a torch.float32 tensor, got torch.bfloat16"). Fake CUDA tensors: no GPU needed."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = FakeTensorMode()

    def fake(*shape, of=dtype):
        return FakeTensor(mode, torch.empty(*shape, dtype=of, device="meta"), torch.device(device))

    table = loop_level()
    with mode:
        running = [fake(6, of=torch.float32), fake(6, of=torch.float32)]
        for name, op, args in _norm_calls(fake(4, 6, 5), fake(6), fake(5), running):
            if device == "cuda" and name in ("batch_norm", "batch_norm_functional"):
                continue  # their running-statistics update makes a CUDA scalar: needs a CUDA build
            expected = [t.dtype for t in op(*args) if isinstance(t, torch.Tensor)]
            got = [t.dtype for t in table[op](*args) if isinstance(t, torch.Tensor)]
            assert got == expected, (name, got, expected)
