"""fold_exact_casts: which cast pairs fold (graph structure), that the folded graph computes
eager's bits, that the dtype table is exactly right (checked against torch's own casts), and
that type promotion of mixed bfloat16/float32 graphs through decompose() matches eager."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.decomp import decompose, fold_exact_casts, loop_level
from kiln.decomp._internal.casts import folds_exactly, is_lossless

aten = torch.ops.aten
bf16, fp16, fp32, fp64 = torch.bfloat16, torch.float16, torch.float32, torch.float64


def _trace(fn, *inputs):
    return make_fx(fn, tracing_mode="fake")(*inputs)


def _casts(gm: fx.GraphModule) -> list[tuple[torch.dtype, torch.dtype]]:
    """(source dtype, result dtype) of each cast node, in graph order."""
    return [
        (n.args[0].meta["val"].dtype, n.meta["val"].dtype)
        for n in gm.graph.nodes
        if n.target in (aten._to_copy.default, torch.ops.prims.convert_element_type.default)
    ]


def _assert_bitwise_equal(got, expected):
    if isinstance(expected, tuple):
        for g, e in zip(got, expected, strict=True):
            _assert_bitwise_equal(g, e)
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


def _fold(fn, *inputs):
    """The folded graph of ``fn``, checked bit for bit against eager on ``inputs``."""
    gm = _trace(fn, *inputs)
    gm, modified = fold_exact_casts(gm)
    _assert_bitwise_equal(gm(*inputs), fn(*inputs))
    return gm, modified


def _bf16_input():
    return (torch.randn(64) * 100).to(bf16)


def test_widen_then_narrow_back_folds_to_nothing():
    gm, modified = _fold(lambda x: x.float().to(bf16) * 2, _bf16_input())
    assert modified and _casts(gm) == []
    mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    assert mul.args[0].op == "placeholder"


def test_narrow_then_widen_rounds_and_stays():
    x = torch.randn(64) + 1
    gm, modified = _fold(lambda x: x.to(bf16).float() * 2, x)
    assert not modified and _casts(gm) == [(fp32, bf16), (bf16, fp32)]


@pytest.mark.parametrize(
    ("source", "middle", "folds"),
    [
        (torch.int8, fp32, True),
        (torch.uint8, bf16, True),
        (torch.bool, fp32, True),
        (torch.int16, fp32, True),
        (torch.int32, fp64, True),
        (torch.int32, fp32, False),  # 2**24 + 1 is not a float32
        (torch.int16, fp16, False),  # 2049 is not a float16
        (fp16, bf16, False),
        (fp64, fp32, False),
    ],
)
def test_round_trips_fold_only_through_a_lossless_middle(source, middle, folds):
    x = _extremes(source)
    gm, modified = _fold(lambda x: x.to(middle).to(source) + x, x)
    assert modified == folds
    assert _casts(gm) == ([] if folds else [(source, middle), (middle, source)])


def test_two_lossless_widenings_become_one_cast():
    gm, modified = _fold(lambda x: x.float().double() * 3, torch.randn(64).to(fp16))
    assert modified and _casts(gm) == [(fp16, fp64)]


def test_widening_then_narrowing_to_another_dtype_stays():
    # bf16 -> fp16 directly is not lossless: eager's two casts are kept as they are
    gm, modified = _fold(lambda x: x.float().to(fp16) * 3, _bf16_input())
    assert not modified and _casts(gm) == [(bf16, fp32), (fp32, fp16)]


def test_middle_value_with_other_users_is_kept_for_them():
    def fn(x):
        wide = x.float()
        return wide.to(bf16) * 2, wide + 1

    gm, modified = _fold(fn, _bf16_input())
    assert modified and _casts(gm) == [(bf16, fp32)]


def test_round_trip_returned_as_output_stays_a_copy():
    x = _bf16_input()
    gm, modified = _fold(lambda x: x.float().to(bf16), x)
    assert modified and _casts(gm) == [(bf16, bf16)]  # one copy, no rounding, never the input
    out = gm(x)
    assert out.data_ptr() != x.data_ptr()


def test_round_trip_read_through_a_view_stays_a_copy():
    # the view would alias the input instead of a fresh tensor: the copy is kept
    gm, modified = _fold(lambda x: x.float().to(bf16).view(8, 8), _bf16_input())
    assert modified and _casts(gm) == [(bf16, bf16)]


def test_convert_element_type_becomes_to_copy_and_folds():
    convert = torch.ops.prims.convert_element_type.default
    gm, modified = _fold(lambda x: convert(convert(x, fp32), bf16) - 1, _bf16_input())
    assert modified and _casts(gm) == []
    gm, modified = _fold(lambda x: convert(x, fp32) - 1, _bf16_input())
    assert modified and _casts(gm) == [(bf16, fp32)]
    assert all(n.target is not convert for n in gm.graph.nodes)


def test_fold_keeps_meta_and_symbolic_shapes():
    gm = make_fx(lambda x: (x.float().to(bf16) + 1).sum(0), tracing_mode="symbolic")(
        torch.randn(5, 3).to(bf16)
    )
    gm, modified = fold_exact_casts(gm)
    assert modified and _casts(gm) == []
    for node in gm.graph.nodes:
        assert node.op == "output" or "val" in node.meta, node
    x = torch.randn(7, 3).to(bf16)
    _assert_bitwise_equal(gm(x), (x + 1).sum(0))


# -- the dtype table against torch's casts ---------------------------------------------------

_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    fp16,
    bf16,
    fp32,
    fp64,
]


def _extremes(dtype: torch.dtype) -> torch.Tensor:
    """Every value of the 8- and 16-bit dtypes; the extremes, the first integers a float of
    each width misses, and random values for the wider ones; NaN, infinities, -0 for floats."""
    if dtype == torch.bool:
        return torch.tensor([False, True])
    if dtype in (torch.uint8, torch.int8, torch.int16):
        info = torch.iinfo(dtype)
        return torch.arange(info.min, info.max + 1, dtype=torch.int64).to(dtype)
    if dtype in (fp16, bf16):
        return torch.arange(-(2**15), 2**15, dtype=torch.int64).to(torch.int16).view(dtype)
    generator = torch.Generator().manual_seed(0)
    if dtype in (torch.int32, torch.int64):
        info = torch.iinfo(dtype)
        special = [info.min, info.max, 0, 1, -1, 2049, 2**24 + 1, -(2**24) - 1]
        if dtype == torch.int64:
            special += [2**53 + 1]
        randoms = torch.randint(info.min, info.max, (4096,), generator=generator, dtype=dtype)
        return torch.cat([torch.tensor(special, dtype=dtype), randoms])
    info = torch.finfo(dtype)
    special = [
        info.min,
        info.max,
        info.tiny,
        info.tiny / 4,
        0.0,
        -0.0,
        1 + info.eps,
        2049.0,
        float("inf"),
        float("-inf"),
        float("nan"),
        1e-30,
        3e38,
    ]
    randoms = torch.randn(4096, generator=generator, dtype=fp64) * 10.0 ** torch.randint(
        -40, 40, (4096,), generator=generator
    )
    return torch.cat([torch.tensor(special, dtype=fp64), randoms]).to(dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        both_nan = a.isnan() & b.isnan()
        same = (a == b) & (a.signbit() == b.signbit())
        return bool((both_nan | same).all())
    return bool((a == b).all())


@pytest.mark.parametrize("source", _DTYPES, ids=str)
def test_lossless_table_is_exactly_what_round_trips(source):
    """is_lossless(S, T) holds exactly when every sampled value of S survives S -> T -> S with
    its sign (uint8 <-> int8 wrap around and back) (the samples hold a value each non-lossless
    pair loses)."""
    x = _extremes(source)
    for target in _DTYPES:
        cast = x.to(target)
        if source == torch.bool or target != torch.bool:
            survives = _same_bits(cast.to(source), x) and bool(((cast < 0) == (x < 0)).all())
        else:
            survives = False  # to bool keeps only nonzero-ness
        assert is_lossless(source, target) == survives, (source, target)


def test_every_fold_the_table_allows_is_bit_exact():
    for source, middle, target in itertools.product(_DTYPES, repeat=3):
        if not folds_exactly(source, middle, target):
            continue
        x = _extremes(source)
        assert _same_bits(x.to(middle).to(target), x.to(target)), (source, middle, target)


# -- type promotion of mixed bfloat16/float32 graphs through decompose() ----------------------

_PROMOTION_CASES = {
    "bf16_plus_fp32": lambda a, b: a + b,
    "bf16_times_python_float": lambda a, b: a * 2.5 + b,
    "bf16_plus_0dim_fp32": lambda a, b: a + b.sum(),  # a 0-dim tensor does not promote
    "where_mixed": lambda a, b: torch.where(a > 0, a, b),
    "cat_mixed": lambda a, b: torch.cat([a, b], 0),
    "softmax_bf16_then_fp32": lambda a, b: torch.softmax(a, -1) * b,
    "layer_norm_fp32_weight": lambda a, b: F.layer_norm(a, (8,), b[0], b[1]),
    "mean_and_var_bf16": lambda a, b: a.mean(-1) + a.var(-1) + b.sum(-1),
    "gelu_silu_bf16": lambda a, b: F.gelu(a) + F.silu(a),
    "div_by_int": lambda a, b: a / torch.arange(1, 9) + b.to(bf16),
    "addcmul_mixed": lambda a, b: torch.addcmul(b, a, a, value=0.5),
    "autocast_round_trip": lambda a, b: (a.float() * b).to(bf16).float().to(bf16) + a,
    "compare_and_mask": lambda a, b: (a.float() > b).to(bf16) * a,
}


class _DtypeRecorder(fx.Interpreter):
    """Runs a graph on real tensors, collecting (node, dtype of what it computed)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.dtypes: list[tuple[fx.Node, torch.dtype]] = []

    def run_node(self, n: fx.Node):
        result = super().run_node(n)
        if n.op != "output" and isinstance(result, torch.Tensor):
            self.dtypes.append((n, result.dtype))
        return result


@pytest.mark.parametrize("name", sorted(_PROMOTION_CASES))
def test_mixed_bf16_fp32_promotion_matches_eager(name):
    fn = _PROMOTION_CASES[name]
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(2, 8, generator=generator).to(bf16)
    b = torch.randn(2, 8, generator=generator)
    gm = decompose(_trace(fn, a, b), loop_level())
    recorder = _DtypeRecorder(gm)
    result = recorder.run(a, b)
    for node, dtype in recorder.dtypes:
        assert node.meta["val"].dtype == dtype, node.format_node()
    expected = fn(a, b)
    assert result.dtype == expected.dtype
    torch.testing.assert_close(result.float(), expected.float(), rtol=1.6e-2, atol=1e-2)
