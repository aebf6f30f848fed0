"""Compiled C++ against eager on the inputs torch's OpInfo samples do not hold: NaN, infinities
and signed zeros planted in every operand, integer division and remainder with either sign,
shifts by out-of-range amounts, float-to-int conversions, ties and NaNs in reductions, views
and indexing of computed (lazy) values, transposed extern operands. Every op on OpInfo's
samples, in every dtype, is the table of integration/tests/test_integration_op_table.py.

Ops are grouped into a few graphs per dtype (one g++ run each) so the suite stays fast; each
graph returns one output per op, so a failure names the output index of the guilty op.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

aten = torch.ops.aten
NAN, INF = math.nan, math.inf
FLOATS = (torch.float32, torch.float64)


def special_floats(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random values with NaN, +-inf, +-0 and 1 planted at fixed positions."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    flat = x.view(-1)
    for k, value in enumerate((NAN, INF, -INF, 0.0, -0.0, 1.0)):
        flat[(seed + 3 * k) % flat.numel()] = value
    return x


def ints(shape: tuple[int, ...], dtype: torch.dtype = torch.int64, low: int = -6, high: int = 7,
         seed: int = 0) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def bools(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.5


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fn: Callable[..., Any]
    inputs: Callable[[torch.dtype], tuple[Any, ...]]
    dtypes: tuple[torch.dtype, ...]


def unary(x):
    return (aten.neg(x), aten.exp(x), aten.log(x), aten.sigmoid(x), aten.tanh(x), aten.relu(x),
            aten.abs(x), aten.sqrt(x), aten.rsqrt(x), aten.reciprocal(x), aten.erf(x), aten.expm1(x),
            aten.log1p(x))


def math_unary(x, unit):
    # `x` has NaN, +-inf, +-0 planted; `unit` lies in (-1, 1) (asin/acos/atanh/erfinv's domain) and
    # also holds +-1 and values outside it.
    out = [getattr(aten, name)(x) for name in (
        "sin", "cos", "tan", "atan", "sinh", "cosh", "asinh", "erfc", "lgamma", "exp2", "log2", "log10", "ceil",
        "floor", "trunc", "round", "sign", "isnan", "isinf", "signbit")]
    out += [getattr(aten, name)(unit) for name in ("asin", "acos", "atanh", "erfinv")]
    out += [aten.acosh(x.abs() + 1), aten.round.decimals(x, decimals=2), aten.round.decimals(x * 100, decimals=-1),
            aten.round(torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997], dtype=x.dtype) + x[0, 0] * 0)]
    return tuple(out)


def math_binary(x, y, row):
    return (aten.atan2(x, y), aten.atan2(x, row), aten.hypot(x, y), aten.copysign.Tensor(x, y),
            aten.copysign.Scalar(x, -2.0), aten.nextafter(x, y), aten.fmax(x, y), aten.fmin(x, row),
            aten.fmod.Tensor(x, y), aten.fmod.Scalar(x, 1.5), aten.remainder.Tensor(x, y),
            aten.remainder.Scalar(x, -1.5), aten.div.Tensor_mode(x, y, rounding_mode="floor"),
            aten.div.Tensor_mode(x, row, rounding_mode="trunc"), aten.div.Scalar_mode(x, -0.3, rounding_mode="floor"),
            aten.pow.Scalar(2.0, x), aten.ldexp.Tensor(x, torch.tensor([3, -2, 0, 1, 5])),
            aten.logical_and(x, y), aten.logical_or(x, row), aten.logical_xor(x, y))


def math_int(x, y, shift):
    # y is nonzero, either sign: floor/trunc division and both remainders differ in sign handling.
    return (aten.div.Tensor_mode(x, y, rounding_mode="floor"), aten.div.Tensor_mode(x, y, rounding_mode="trunc"),
            aten.div.Scalar_mode(x, -4, rounding_mode="floor"), aten.remainder.Tensor(x, y),
            aten.remainder.Scalar(x, -4), aten.fmod.Tensor(x, y), aten.fmod.Scalar(x, 3), aten.fmax(x, y),
            aten.fmin(x, y), aten.sign(x), aten.ceil(x), aten.isnan(x), aten.isinf(x), aten.signbit(x),
            aten.bitwise_and.Tensor(x, y), aten.bitwise_and.Scalar(x, 6), aten.bitwise_or.Tensor(x, y),
            aten.bitwise_or.Scalar(x, 5), aten.bitwise_xor.Tensor(x, y),
            aten.bitwise_not(x), aten.bitwise_left_shift.Tensor(x, shift), aten.bitwise_right_shift.Tensor(x, shift),
            aten.bitwise_and.Tensor(x > 0, y > 0), aten.bitwise_xor.Scalar(x > 0, True), aten.bitwise_not(x > 0),
            aten.logical_xor(x, y > 0), aten.pow.Scalar(3, x.abs()), aten.exp2(x), aten.atan2(x, y), aten.gcd(x, y),
            aten.gcd(x, x * 0), aten.lcm(x, y), aten.lcm(x * 0, y * 0))


def indexing(x, y, i, rows):
    # i holds in-range indices of x's last dim, negative ones too (index.Tensor wraps them).
    discard = x == x  # always true: the uninitialized operand is discarded
    return (aten.cat([x, y * 2, x[:, :1]], 1), aten.cat([x[:1], x], 0), aten.constant_pad_nd(x, [1, 2, -1, 1], 3),
            aten.constant_pad_nd(x * 2, [0, 0, 2, 0]), aten.flip(x, [0, -1]), aten.flip(x * 2, [1]),
            aten.arange.start_step(2, 11, 3), aten.arange.start_step(0.5, 3.0, 0.25, dtype=torch.float32),
            aten.index_select(x, 1, i.abs()), aten.index_select(x * 2, 0, rows), aten.gather(x, 1, rows.view(3, 1)),
            aten.index.Tensor(x, [rows, i[:3]]), aten.index.Tensor(x, [None, i]), aten.index.Tensor(x, [i[:1], None]),
            aten.gather(x, 1, i.abs().expand(3, 4)).sum(1), aten.slice_scatter(x, y, 1, 1, None, 2),
            aten.slice_scatter(x, x[:2] * 3, 0, -2), aten.select_scatter(x, y[:, 0], 1, -1),
            aten.where.self(discard, x, aten.empty.memory_format([3, 4], dtype=x.dtype)),
            aten.where.self(discard, x, aten.empty_strided([3, 4], [1, 3], dtype=x.dtype)),
            aten.where.self(discard, x, aten.empty_permuted([3, 4], [1, 0], dtype=x.dtype)))


def binary_float(x, y, row, col, scalar):
    # y has NaNs where x does not: maximum/minimum must propagate either side's NaN.
    return (aten.add.Tensor(x, y, alpha=2), aten.sub.Tensor(x, row, alpha=0.5), aten.mul.Tensor(x, col),
            aten.div.Tensor(x, y), aten.maximum(x, y), aten.minimum(x, y), aten.maximum(x, scalar),
            aten.pow.Tensor_Tensor(x.abs(), row), aten.pow.Tensor_Scalar(x, 2), aten.pow.Tensor_Scalar(x, -0.5),
            aten.add.Scalar(x, 2), aten.sub.Scalar(x, 1.5), aten.mul.Scalar(x, -3), aten.div.Scalar(x, 4),
            x * scalar + 1, x / 3.0)


def binary_int(x, y, row, positive):
    out = [aten.add.Tensor(x, y, alpha=3), aten.sub.Tensor(x, row), aten.mul.Tensor(x, y), x * 7,
           aten.div.Tensor(x, positive), aten.maximum(x, row), aten.minimum(x, y), aten.neg(x), aten.abs(x),
           aten.relu(x), aten.pow.Tensor_Scalar(x, 3), aten.pow.Tensor_Tensor(x, positive),
           aten.pow.Tensor_Scalar(positive + 2, 13), aten.add.Scalar(x, 2), aten.mul.Scalar(x, 2.5), x + 0.5]
    if x.dtype == torch.int64:  # exact beyond 2**53, where a pow through double would round
        out.append(aten.pow.Tensor_Scalar(positive + 2, 27))
    return tuple(out)


def comparisons(x, y, row):
    out = []
    for op in (aten.eq, aten.ne, aten.lt, aten.le, aten.gt, aten.ge):
        out += [op.Tensor(x, y), op.Tensor(x, row), op.Scalar(x, 1)]
    if x.dtype != torch.bool:
        out += [aten.gt.Scalar(x, 0.5), aten.where.self(x > row, x, y), torch.where(x < 0, x, 2.5)]
    out += [aten.logical_not(x), aten.where.self(aten.logical_not(x), y, row)]
    return tuple(out)


def copies(x, finite):
    # float -> int of NaN/inf is undefined (in C++ and in torch alike): only finite values.
    return (aten.clone(x), x.to(torch.float64), x.to(torch.float32), finite.to(torch.int64), x.to(torch.bool),
            finite.to(torch.int32), finite.to(torch.int64).to(x.dtype), torch.tensor([1.5, -2.0, 3.0], dtype=x.dtype) * x[0, :3],
            aten.scalar_tensor.default(3.0) + x, torch.full((2, 3), INF, dtype=x.dtype),
            torch.full((2, 3), -INF, dtype=x.dtype) + x[:2, :3], torch.full((3,), NAN, dtype=x.dtype),
            torch.where(x > 0, x, -INF), torch.full((), 7, dtype=torch.int64), torch.full((2,), True))


def reductions(x):
    out = [x.sum(1), x.sum((0, 2), keepdim=True), x.sum(), x.sum(-1, dtype=torch.float64),
           x.amax(0), x.amax((1, 2), keepdim=True), x.amax(), x.amin(-1), x.amin((0, 1)), x.amin()]
    if x.dtype.is_floating_point:
        out += [x.mean(1), x.mean((0, -1), keepdim=True), x.mean()]
    out += [x.prod(1), x[:, :2, :3].prod(), x.max(), x.min(), x.any(), x.any(-1), x.all(), x.all(1),
            aten.any.dims(x, [0, 2], True),
            aten.all.dims(x, [1, 2])]
    if x.dtype != torch.bool:  # ties (3.0 rows) and NaNs: the first position wins
        y = torch.where(x[..., :1] > 0, 3, x)
        out += [x.argmax(), x.argmin(1, keepdim=True), *aten.max.dim(y, -1), *aten.min.dim(x, 0), y.argmin(2)]
    return tuple(out)


def views(x, v):
    y = x * 2  # a computed (lazy) value: views of it are index functions, not strides
    out = []
    for t in (x, y):
        out += [t.view(4, 6), aten._unsafe_view(t, [24]), t.reshape(6, 4), aten.alias(t), aten.detach(t),
                t.permute(2, 0, 1),
                t[0].t(), t.transpose(0, 2), t[:, :1].expand(2, 5, 4), t.unsqueeze(1), t[:, :1].squeeze(1),
                t.unsqueeze(0).squeeze(0), t[:1, :, :1].squeeze(), t[:, 1:3, ::2], t[:, -2:], t.select(1, -1),
                t.select(2, 0), t.transpose(0, 1).reshape(3, 8) + 1, t.diagonal(1, 0, 2), t.diagonal(-1, 2, 1) + 1,
                t.unfold(2, 2, 1), t.unfold(1, 2, 2) * 2, aten.diagonal_scatter(t, t.diagonal(1, 0, 2) * 3, 1, 0, 2)]
    out += [aten.squeeze.dims(v, [0, 2]), v[0].expand(2, 3, 4) + x.sum()]
    return tuple(out)


def externs(a, w, b, c, d):
    return (aten.mm(a, w.t()), aten.addmm(b, a, w.t()).relu(), aten.addmm(b, a.t().t(), w.t(), beta=0.5, alpha=2),
            aten.bmm(c, d.transpose(1, 2)) * 2, (aten.mm(a, w.t()) + b).sum(1))


def nonzero_ints(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    x = ints(shape, dtype, 1, 9, seed=seed)
    return torch.where(ints(shape, dtype, 0, 2, seed=seed + 1) == 0, -x, x)


CASES = [
    Case("indexing", indexing, lambda dt: (
        torch.randn(3, 4).to(dt) * 5, torch.randn(3, 2).to(dt) * 5, torch.tensor([1, -1, 0, 3]), torch.tensor([2, 0, 2])),
         (torch.float32, torch.int64)),
    Case("math_unary", math_unary, lambda dt: (
        special_floats((5, 6), dt), torch.cat([torch.tensor([1.0, -1.0, 1.5, NAN]), torch.rand(26) * 1.98 - 0.99])
        .view(5, 6).to(dt)), FLOATS),
    Case("math_binary", math_binary, lambda dt: (
        special_floats((4, 5), dt), special_floats((4, 5), dt, seed=1), special_floats((5,), dt, seed=2)), FLOATS),
    Case("math_int", math_int, lambda dt: (
        ints((4, 8), dt, -40, 40), nonzero_ints((4, 8), dt, seed=1),
        torch.tensor([-1, 0, 1, 3, 31, 32, 63, 64], dtype=dt)), (torch.int64, torch.int32)),
    Case("unary", unary, lambda dt: (special_floats((5, 6), dt),), FLOATS),
    Case("binary_float", binary_float, lambda dt: (
        special_floats((4, 5), dt), special_floats((4, 5), dt, seed=1), special_floats((5,), dt, seed=2).abs() - 1,
        special_floats((4, 1), dt, seed=3), torch.tensor(0.5, dtype=dt)), FLOATS),
    Case("binary_int", binary_int, lambda dt: (
        ints((4, 5), dt), ints((4, 5), dt, seed=1), ints((5,), dt, seed=2), ints((4, 5), dt, 1, 4, seed=3)),
         (torch.int64, torch.int32)),
    Case("comparisons", comparisons, lambda dt: (
        (bools((4, 5)), bools((4, 5), 1), bools((5,), 2)) if dt == torch.bool else
        (special_floats((4, 5), dt) if dt.is_floating_point else ints((4, 5), dt),
         special_floats((4, 5), dt, 1) if dt.is_floating_point else ints((4, 5), dt, seed=1),
         special_floats((5,), dt, 2) if dt.is_floating_point else ints((5,), dt, seed=2))),
         (torch.float32, torch.float64, torch.int64, torch.bool)),
    Case("copies", copies, lambda dt: (special_floats((4, 5), dt), torch.randn(4, 5, dtype=dt) * 5), FLOATS),
    Case("reductions", reductions, lambda dt: (
        special_floats((3, 4, 5), dt) if dt.is_floating_point else
        bools((3, 4, 5)) if dt == torch.bool else ints((3, 4, 5), dt),),
         (torch.float32, torch.float64, torch.int64, torch.bool)),
    Case("views", views, lambda dt: (torch.randn(2, 3, 4).to(dt), torch.randn(1, 2, 1, 4).to(dt)),
         (torch.float32, torch.int64)),
    Case("externs", externs, lambda dt: (
        torch.randn(4, 5, dtype=dt), torch.randn(6, 5, dtype=dt), torch.randn(6, dtype=dt),
        torch.randn(2, 3, 5, dtype=dt), torch.randn(2, 4, 5, dtype=dt)), FLOATS),
]


def _params():
    for case in CASES:
        for dtype in case.dtypes:
            yield pytest.param(case, dtype, id=f"{case.name}-{str(dtype).removeprefix('torch.')}")


@pytest.mark.parametrize(("case", "dtype"), list(_params()))
def test_compiled_matches_eager(cpp, case: Case, dtype: torch.dtype):
    args = case.inputs(dtype)
    compiled = cpp.check(case.fn, *args)
    assert compiled.kernel_graph.kernels, "the graph should contain generated kernels"
    assert compiled.source.count('extern "C" void') == len(compiled.kernel_graph.kernels)


def test_parallel_paths_match_eager(cpp_parallel):
    """The same tables with every OpenMP region forced on (threads on tiny sizes)."""
    for case in (c for c in CASES if c.name in ("binary_float", "reductions", "views")):
        cpp_parallel.check(case.fn, *case.inputs(torch.float32))
