"""Edge cases of loopir's lowerings, each against eager, that torch's OpInfo samples do not
reach: NaN, infinities and signed zeros; integer division and remainder with either sign;
shifts by out-of-range amounts; type promotion across dtypes, 0-d tensors and Python scalars;
0-d and empty inputs of unary ops; ties and NaNs in arg-reductions; views and indexing of
computed (lazy) values, negative and computed indices. Every op on OpInfo's samples, in every
dtype and on every backend, is the table of integration/tests/test_integration_op_table.py.

Each case calls the ATen overload directly so the traced graph is known to contain it; the
test checks the graph holds the op (the case tests what it claims), the kernel graph's
structure (pointwise and reduction ops make exactly one kernel and no extern; externs make
an extern call of that op) and its numerics, dtype included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, verify
from kiln.loopir._internal.registry import default_lowerings

aten = torch.ops.aten


def f32(*size):
    return torch.randn(size)


def f64(*size):
    return torch.randn(size, dtype=torch.float64)


def pos(*size):  # positive floats, for log/sqrt/rsqrt/pow
    return torch.rand(size) + 0.25


def i64(*size, low=-5, high=6, dtype=torch.int64):
    return torch.randint(low, high, size, dtype=dtype)


def nonzero(*size):  # for integer division
    return i64(*size, low=1, high=6) * torch.where(torch.rand(size) > 0.5, 1, -1)


def i32(*size):
    return i64(*size, dtype=torch.int32)


def bools(*size):
    return torch.rand(size) > 0.5


def with_nan(*size):  # every third element NaN
    x = torch.randn(size)
    x.view(-1)[::3] = float("nan")
    return x


def specials(*size, dtype=torch.float32):  # NaN, +-inf, +-0, 1 and -1.5 planted among random values
    x = (torch.randn(size) * 3).to(dtype)
    values = (float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.5)
    x.view(-1)[:len(values)] = torch.tensor(values[:x.numel()], dtype=dtype)
    return x


@dataclasses.dataclass(frozen=True)
class Case:
    op: Any
    fn: Callable[..., Any]
    args: tuple[Callable[[], Any], ...]  # builders, so each run gets fresh inputs
    mode: str = "real"
    desc: str = ""
    retarget: Any = None  # op traced in place of `op` (make_fx decomposes `op` itself away)


def case(op, fn, *args, mode="real", desc="", retarget=None):
    return Case(op, fn, tuple(args), mode, desc, retarget)


def promotion_cases(op, scalar_op, *, name):
    """Mixed dtypes, 0-d tensors, Python scalars and empty inputs (OpInfo samples hold one dtype)."""
    ok = {"div": nonzero}.get(name, i64)
    return [
        case(op, lambda a, b: op(a, b), lambda: i32(3, 4), lambda: ok(3, 1), desc="int32+int64"),
        case(op, lambda a, b: op(a, b), lambda: i64(3, 4), lambda: pos(4), desc="int+float"),
        case(op, lambda a, b: op(a, b), lambda: f32(3, 4), lambda: f64(), desc="0-d float64 keeps float32"),
        case(op, lambda a, b: op(a, b), lambda: i64(3, 4), lambda: pos(), desc="0-d float lifts int"),
        case(op, lambda a: op(a, 2.5), lambda: f32(3, 4), desc="float scalar"),
        case(op, lambda a: op(a, 3), lambda: i64(3, 4), desc="int scalar"),
        case(op, lambda a: op(a, 0.5), lambda: i64(2, 3), desc="int tensor, float scalar"),
        case(op, lambda a, b: op(a, b), lambda: f32(0, 3), lambda: f32(3), desc="empty"),
        case(scalar_op, lambda a: scalar_op(a, 2), lambda: i64(3, 4), desc="Scalar overload int"),
    ]


def comparison_cases(name):
    tensor_op, scalar_op = getattr(aten, name).Tensor, getattr(aten, name).Scalar
    return [
        case(tensor_op, lambda a, b: tensor_op(a, b), lambda: i64(3, 4, low=-2, high=3),
             lambda: i64(3, 4, low=-2, high=3).double(), desc="int vs float64"),
        case(tensor_op, lambda a, b: tensor_op(a, b), lambda: f32(3, 4), lambda: f64(), desc="0-d float64"),
        case(tensor_op, lambda a, b: tensor_op(a, b), lambda: with_nan(3, 4), lambda: f32(3, 4), desc="NaN"),
        case(scalar_op, lambda a: scalar_op(a, 0.5), lambda: i64(3, 4, low=-2, high=3), desc="int vs 0.5"),
        case(scalar_op, lambda a: scalar_op(a, 2), lambda: bools(3, 4), desc="bool vs 2 promotes to int"),
        case(scalar_op, lambda a: scalar_op(a, 1), lambda: bools(3, 4), desc="bool vs 1"),
    ]


def unary_cases(name, make=f32):
    """0-d and empty inputs, and NaNs: OpInfo's unary samples are one random [20, 20] tensor."""
    op = getattr(aten, name).default
    return [
        case(op, lambda a: op(a), lambda: make(), desc="0-d"),
        case(op, lambda a: op(a), lambda: make(0, 4), desc="empty"),
        case(op, lambda a: op(a), lambda: with_nan(2, 3).abs() if make is pos else with_nan(2, 3), desc="NaN"),
    ]


def with_scalar(op, value, **kwargs):
    return lambda a: op(a, value, **kwargs)


def with_kwargs(op, **kwargs):
    return lambda a, b: op(a, b, **kwargs)


def math_cases():
    """Pointwise math on specials (NaN, inf, signed zeros); integer division and remainder
    with either sign."""
    out = []
    for name in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erfc",
                 "erfinv", "lgamma", "exp2", "log2", "log10", "ceil", "floor", "trunc", "round", "sign"):
        op = getattr(aten, name).default
        out.append(case(op, op, lambda: specials(4, 5), desc="specials"))
    for name in ("atan2", "hypot", "nextafter", "fmax", "fmin"):
        op = getattr(aten, name).default
        out.append(case(op, op, lambda: specials(4, 5), lambda: specials(4, 5).flip(0), desc="specials"))
    for name in ("gcd", "lcm"):
        op = getattr(aten, name).default
        out.append(case(op, op, lambda: i32(3, 4), lambda: torch.zeros(3, 4, dtype=torch.int32), desc="zeros"))
    out.append(case(aten.atan2.default, aten.atan2.default, lambda: i64(3, 4), lambda: i32(4), desc="int -> float"))
    for packet in (aten.copysign, aten.fmod, aten.remainder):
        out.append(case(packet.Tensor, packet.Tensor, lambda: specials(4, 5), lambda: specials(4, 5).flip(1),
                        desc="specials"))
    for packet in (aten.fmod, aten.remainder):
        out.append(case(packet.Tensor, packet.Tensor, lambda: i64(3, 4, low=-9, high=9),
                        lambda: nonzero(4), desc="int, signs"))
    for mode in ("floor", "trunc", None):
        div = with_kwargs(aten.div.Tensor_mode, rounding_mode=mode)
        out += [case(aten.div.Tensor_mode, div, lambda: i64(3, 4, low=-9, high=9), lambda: nonzero(4),
                     desc=f"int {mode}"),
                case(aten.div.Tensor_mode, div, lambda: specials(4, 5), lambda: specials(4, 5).flip(0),
                     desc=f"specials {mode}"),
                case(aten.div.Scalar_mode, with_scalar(aten.div.Scalar_mode, -2, rounding_mode=mode),
                     lambda: i32(3, 4), desc=f"Scalar {mode}")]
    for name in ("isnan", "isinf", "signbit"):
        op = getattr(aten, name).default
        out.append(case(op, op, lambda: specials(4, 5), desc="specials"))
    return out


def logical_and_bitwise_cases():
    """Mixed dtypes, and shifts by negative and too large amounts (torch's results)."""
    out = []
    for name in ("logical_and", "logical_or", "logical_xor"):
        op = getattr(aten, name).default
        out.append(case(op, op, lambda: specials(4, 5), lambda: i64(4, 5, low=-1, high=2), desc="float and int"))
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        packet = getattr(aten, name)
        out.append(case(packet.Tensor, packet.Tensor, lambda: i64(3, 4, low=-50, high=50), lambda: i32(4),
                        desc="int64 and int32"))
    shifts = lambda: torch.tensor([-1, 0, 1, 31, 32, 63, 64, 3])  # noqa: E731
    out += [case(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor, lambda: i64(2, 8), shifts),
            case(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor, lambda: i64(2, 8), shifts),
            case(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor,
                 lambda: i32(2, 8), lambda: shifts().int(), desc="int32")]
    return out


def indexes(*values):
    return lambda: torch.tensor(values)


def discarded(make_empty):
    return lambda a: aten.where.self(a == a, a, make_empty())


def indexing_cases():
    """Several sources selected by index predicates, and reads at loaded (indirect) indices, of
    computed (lazy) values: broadcast index tensors, indices computed in the same kernel,
    negative indices wrapping (index.Tensor; eager's gather and index_select refuse them)."""
    empty_ops = ((aten.empty.memory_format, lambda: aten.empty.memory_format([3, 4])),
                 (aten.empty_strided.default, lambda: aten.empty_strided.default([3, 4], [1, 3])),
                 (aten.empty_permuted.default, lambda: aten.empty_permuted.default([3, 4], [1, 0])))
    out = [
        case(aten.cat.default, lambda a, b: aten.cat.default([a, b * 2, a[:, :1]], 1), lambda: f32(3, 4),
             lambda: f32(3, 2), desc="lazy"),
        case(aten.cat.default, lambda a, b: aten.cat.default([a, b, torch.full([0], 1.0)]), lambda: i64(2, 3),
             lambda: f32(1, 3), desc="promotes, legacy empty"),
        case(aten.cat.default, lambda a: aten.cat.default([a, a], -1), lambda: f32(2, 3), mode="symbolic",
             desc="symbolic"),
        case(aten.constant_pad_nd.default, lambda a: aten.constant_pad_nd.default(a, [1, 2, -1, 1], 3.5),
             lambda: f32(3, 4), desc="pad and crop"),
        case(aten.constant_pad_nd.default, lambda a: aten.constant_pad_nd.default(a * 2, [2, 0]), lambda: i64(3, 4),
             desc="lazy int"),
        case(aten.flip.default, lambda a: aten.flip.default(a * 2, [1]), lambda: f32(3, 4), desc="lazy"),
        case(aten.arange.start_step, lambda a: aten.arange.start_step(2, 11, 3) + a, lambda: i64(3)),
        case(aten.arange.start_step, lambda: aten.arange.start_step(0.5, 3.0, 0.25, dtype=torch.float32),
             desc="float"),
        case(aten.index_select.default, lambda a, i: aten.index_select.default(a * 2, 0, i % 3), lambda: f32(3, 4),
             indexes(5, 1), desc="computed index, lazy source"),
        case(aten.gather.default, lambda a, i: aten.gather.default(a * 2, 0, i), lambda: i64(3, 4),
             lambda: torch.tensor([[2, 0, 1, 1]]), desc="dim 0, lazy source"),
        case(aten.index.Tensor, lambda a, i: aten.index.Tensor(a, [i]), lambda: f32(3, 4), indexes(2, -1, 0),
             desc="negative"),
        case(aten.index.Tensor, lambda a, i, j: aten.index.Tensor(a, [None, i, j]), lambda: f32(2, 3, 4),
             lambda: torch.tensor([[0], [2]]), indexes(-1, 1, 3), desc="adjacent, broadcast"),
        case(aten.index.Tensor, lambda a, i, j: aten.index.Tensor(a, [i, None, j]), lambda: f32(2, 3, 4),
             indexes(1, 0), lambda: torch.tensor([3, -2], dtype=torch.int32), desc="split: batch dims first"),
        case(aten.slice_scatter.default, lambda a, b: aten.slice_scatter.default(a, b * 2, 0, -2), lambda: f32(3, 4),
             lambda: i64(2, 4), desc="negative start, promotes"),
        case(aten.diagonal_scatter.default, lambda a, b: aten.diagonal_scatter.default(a, b, -1), lambda: i64(3, 4),
             lambda: i64(2), desc="below"),
        case(aten.diagonal.default, lambda a: aten.diagonal.default(a * 2, -1, -1, 0) + 1, lambda: f32(3, 4),
             desc="lazy"),
        case(aten.unfold.default, lambda a: aten.unfold.default(a + 1, 0, 3, 1) * 2, lambda: f32(4, 2),
             desc="lazy, overlapping"),
    ]
    for op, make in empty_ops:  # uninitialized: only where() discarding it is comparable
        out.append(case(op, discarded(make), lambda: f32(3, 4)))
    return out


def ties_and_nans(*size):  # repeated maxima and minima, NaNs in some rows
    x = torch.randint(-2, 3, size).float()
    x.view(-1)[5::7] = float("nan")
    return x


def more_reduction_cases():
    """NaNs, ties (the first position wins), empty and mixed-dtype reductions."""
    out = [case(aten.max.default, aten.max.default, lambda: with_nan(3, 4))]
    for packet in (aten.any, aten.all):
        out.append(case(packet.dims, with_scalar(packet.dims, [0, 2], keepdim=True), lambda: with_nan(2, 3, 4),
                        desc="float, NaN is true"))
    for packet in (aten.argmax, aten.argmin):
        out += [case(packet.default, packet.default, lambda: ties_and_nans(3, 4), desc="flat"),
                case(packet.default, with_scalar(packet.default, 1, keepdim=True), lambda: ties_and_nans(2, 5, 3),
                     desc="dim keepdim"),
                case(packet.default, with_scalar(packet.default, -1), lambda: i64(3, 6, low=-2, high=2),
                     desc="int ties")]
    for packet in (aten.max, aten.min):
        out.append(case(packet.dim, with_scalar(packet.dim, -1), lambda: ties_and_nans(3, 7)))
    out += [
        case(aten.sum.dim_IntList, lambda a: aten.sum.dim_IntList(a, [2, 0], True), lambda: f32(2, 3, 4),
             desc="2 dims keepdim, unsorted"),
        case(aten.sum.dim_IntList, lambda a: aten.sum.dim_IntList(a, [1], dtype=torch.float64), lambda: f32(3, 4),
             desc="dtype kwarg"),
        case(aten.sum.dim_IntList, lambda a: aten.sum.dim_IntList(a, [0]), lambda: f32(0, 3), desc="empty reduced"),
        case(aten.sum.dim_IntList, lambda a: aten.sum.dim_IntList(a, [1]), lambda: f32(0, 3), desc="empty outer"),
        case(aten.sum.dim_IntList, lambda a: aten.sum.dim_IntList(a, [1]), lambda: with_nan(3, 4), desc="NaN"),
        case(aten.sum.dim_IntList, lambda a: aten.sum.dim_IntList(a, [1], True), lambda: f32(2, 1, 4),
             desc="size-1 dim"),
        case(aten.amax.default, lambda a: aten.amax.default(a, [1]), lambda: with_nan(3, 4), desc="NaN"),
        case(aten.amin.default, lambda a: aten.amin.default(a, [0]), lambda: with_nan(3, 4), desc="NaN"),
        case(aten.mean.dim, lambda a: aten.mean.dim(a, [1], dtype=torch.float64), lambda: f32(3, 4), desc="dtype"),
        case(aten.mean.dim, lambda a: aten.mean.dim(a, [0]), lambda: f32(0, 3), desc="empty: NaN"),
        case(aten.mean.dim, lambda a: aten.mean.dim(a, [1], dtype=torch.float32), lambda: i64(3, 4),
             desc="int input, float dtype"),
    ]
    return out


CASES: list[Case] = [
    *math_cases(),
    *more_reduction_cases(),
    *indexing_cases(),
    *logical_and_bitwise_cases(),
    *promotion_cases(aten.add.Tensor, aten.add.Scalar, name="add"),
    case(aten.add.Tensor, lambda a, b: aten.add.Tensor(a, b, alpha=2), lambda: i64(3, 4), lambda: i64(4),
         desc="alpha"),
    case(aten.add.Tensor, lambda a, b: aten.add.Tensor(a, b, alpha=0.5), lambda: f32(3, 4), lambda: f32(4),
         desc="float alpha"),
    case(aten.add.Scalar, lambda a: aten.add.Scalar(a, 2, alpha=3), lambda: f32(3), desc="Scalar alpha"),
    *promotion_cases(aten.sub.Tensor, aten.sub.Scalar, name="sub"),
    case(aten.sub.Tensor, lambda a, b: aten.sub.Tensor(a, b, alpha=3), lambda: i64(3, 4), lambda: i64(4),
         desc="alpha"),
    *promotion_cases(aten.mul.Tensor, aten.mul.Scalar, name="mul"),
    case(aten.mul.Tensor, lambda a, b: aten.mul.Tensor(a, b), lambda: i64(3, 4), lambda: bools(4),
         desc="int*bool"),
    *promotion_cases(aten.div.Tensor, aten.div.Scalar, name="div"),
    case(aten.div.Tensor, lambda a: aten.div.Tensor(a, 2), lambda: i64(3, 4), desc="int/2 is true division"),
    case(aten.maximum.default, lambda a, b: aten.maximum.default(a, b), lambda: i64(3, 4), lambda: pos(4),
         desc="int vs float"),
    case(aten.maximum.default, lambda a, b: aten.maximum.default(a, b), lambda: with_nan(3, 4),
         lambda: f32(3, 4), desc="NaN propagates"),
    case(aten.minimum.default, lambda a, b: aten.minimum.default(a, b), lambda: f32(3, 4), lambda: with_nan(4),
         desc="NaN propagates"),
    case(aten.pow.Tensor_Scalar, lambda a: aten.pow.Tensor_Scalar(a, 2), lambda: f32(3, 4), desc="square"),
    case(aten.pow.Tensor_Scalar, lambda a: aten.pow.Tensor_Scalar(a, 3), lambda: i64(3, 4), desc="int cube"),
    case(aten.pow.Tensor_Scalar, lambda a: aten.pow.Tensor_Scalar(a, 0.5), lambda: i64(3, 4, low=0),
         desc="int ** float"),
    *unary_cases("neg"), *unary_cases("exp"), *unary_cases("log", pos), *unary_cases("sigmoid"),
    *unary_cases("tanh"), *unary_cases("relu"), *unary_cases("abs"), *unary_cases("sqrt", pos),
    *unary_cases("rsqrt", pos), *unary_cases("erf"), *unary_cases("expm1"), *unary_cases("reciprocal", pos),
    case(aten.expm1.default, aten.expm1.default, lambda: f32(3, 4) * 1e-6, desc="tiny x"),
    case(aten.log1p.default, aten.log1p.default, lambda: f32(3, 4) * 1e-6, desc="tiny x"),
    *[c for name in ("eq", "ne", "lt", "le", "gt", "ge") for c in comparison_cases(name)],
    case(aten.logical_not.default, aten.logical_not.default, lambda: i64(3, 4, low=-1, high=2), desc="int"),
    case(aten.logical_not.default, aten.logical_not.default, lambda: with_nan(3, 4), desc="float, NaN"),
    case(aten.where.self, lambda c, a, b: aten.where.self(c, a, b), lambda: bools(4), lambda: i64(3, 4),
         lambda: f32(3, 1), desc="int/float promote, broadcast cond"),
    case(aten.where.self, lambda c, a: torch.where(c, a, 0.0), lambda: bools(3, 4), lambda: f32(3, 4),
         desc="scalar other via scalar_tensor"),
    case(aten.clone.default, lambda a: aten.clone.default(a.t()), lambda: f32(3, 4), desc="of transposed"),
    case(aten._to_copy.default, lambda a: a.to(torch.int64), lambda: f32(3, 4) * 4, desc="f32 -> i64 truncates"),
    case(aten._to_copy.default, lambda a: a.to(torch.bool), lambda: with_nan(3, 4), desc="f32 -> bool, NaN"),
    case(aten.scalar_tensor.default, lambda a: aten.scalar_tensor.default(2.7, dtype=torch.int64) + a,
         lambda: i64(3), desc="float value, int dtype"),
    case(aten.full.default, lambda: aten.full.default([2, 3], 2.7, dtype=torch.int64), desc="truncates"),
    case(aten._unsafe_view.default, lambda a: aten._unsafe_view.default(a * 2, [12]), lambda: f32(3, 4),
         desc="of a lazy value"),
    case(aten.reshape.default, lambda a: aten.view.default(a * 2, [2, 6]), lambda: f32(3, 4),
         retarget=aten.view.default, desc="of a lazy value (make_fx decomposes reshape)"),
    case(aten.detach.default, lambda a: aten.detach.default(a * 2) + 1, lambda: f32(3, 4)),
    case(aten.expand.default, lambda a: aten.expand.default(a * 2, [-1, 4]) + 1, lambda: f32(3, 1),
         desc="of a lazy value, -1"),
    case(aten.mm.default, aten.mm.default, lambda: f32(3, 5), lambda: f32(5, 4)),
    case(aten.addmm.default, lambda b, x, y: aten.addmm.default(b, x, y, beta=0.5, alpha=2.0),
         lambda: f32(3, 4), lambda: f32(3, 5), lambda: f32(5, 4), desc="beta/alpha"),
    case(aten.bmm.default, aten.bmm.default, lambda: f32(2, 3, 5), lambda: f32(2, 5, 4)),
]


def _case_id(c: Case) -> str:
    return f"{c.op}-{c.desc}".replace(" ", "_")


@pytest.mark.parametrize("c", CASES, ids=[_case_id(c) for c in CASES])
def test_op_matches_eager(c: Case):
    torch.manual_seed(0)
    args = tuple(make() for make in c.args)
    gm = make_fx(c.fn, tracing_mode=c.mode)(*args)
    for node in gm.graph.nodes:
        if c.retarget is not None and node.target == c.retarget:
            node.target = c.op
    gm.recompile()
    assert c.op in {n.target for n in gm.graph.nodes}, "the case does not exercise its op"
    kg = lower(gm)
    verify(kg)
    torch.testing.assert_close(kg(*args), c.fn(*args), equal_nan=True)
    kind = default_lowerings()[c.op].kind
    if kind == "extern":
        assert [e.op for e in kg.externs] == [c.op]
    elif kind in ("pointwise", "reduction", "constant"):
        assert len(kg.kernels) == 1 and not kg.externs, str(kg)
    else:
        assert not kg.externs
