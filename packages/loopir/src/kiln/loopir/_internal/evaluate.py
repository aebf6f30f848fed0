"""The reference evaluator: runs a `Kernel` with torch, vectorized over its whole iteration space.

It is an ops handler like any codegen, so it checks lowering and scheduling without compiling
anything. Index variables are broadcast `arange` tensors; loads and stores index flat views of
each buffer starting at its first element, exactly as generated code does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch

from . import philox
from .ir import BufferSpec, Kernel, Scatter
from .ops import OpsHandler
from .sizes import FloorDiv, evaluate_expr, free_size_symbols, index_vars, indirect_var


def eval_index(expr: Any, env: dict[sympy.Symbol, Any]) -> Any:
    """Evaluate an index expression; symbols bound to ints or int64 tensors."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return env[expr]
    args = [eval_index(a, env) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return _fold(args, lambda a, b: a + b)
    if isinstance(expr, sympy.Mul):
        return _fold(args, lambda a, b: a * b)
    if isinstance(expr, FloorDiv):
        return args[0] // args[1]
    if isinstance(expr, sympy.Mod):
        return args[0] % args[1]
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp >= 0:
        return args[0] ** int(expr.exp)
    if isinstance(expr, (sympy.Max, sympy.Min)):
        pick = torch.maximum if isinstance(expr, sympy.Max) else torch.minimum
        return _fold([torch.as_tensor(a) for a in args], pick)
    raise NotImplementedError(f"reference evaluator cannot evaluate index expression {expr}")


def _fold(values: list[Any], fn: Any) -> Any:
    result = values[0]
    for v in values[1:]:
        result = fn(result, v)
    return result


_TORCH_FUNCS = {
    "neg": torch.neg, "exp": torch.exp, "log": torch.log, "sigmoid": torch.sigmoid,
    "erf": torch.erf, "expm1": torch.expm1, "log1p": torch.log1p,
    "tanh": torch.tanh, "relu": torch.relu, "abs": torch.abs, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "logical_not": torch.logical_not,
    "identity": lambda x: x,
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide,
    "maximum": torch.maximum, "minimum": torch.minimum, "pow": torch.pow,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
    "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "erfc": torch.erfc, "erfinv": torch.erfinv, "lgamma": torch.lgamma,
    "exp2": torch.exp2, "log2": torch.log2, "log10": torch.log10, "ceil": torch.ceil, "floor": torch.floor,
    "trunc": torch.trunc, "round": torch.round, "sign": torch.sign, "signbit": torch.signbit,
    "isnan": torch.isnan, "isinf": torch.isinf, "bitwise_not": torch.bitwise_not,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "truncdiv": lambda a, b: _truncdiv(a, b),
    "remainder": torch.remainder, "fmod": torch.fmod, "atan2": torch.atan2, "hypot": torch.hypot,
    "copysign": torch.copysign, "nextafter": torch.nextafter, "fmax": torch.fmax, "fmin": torch.fmin,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "gcd": torch.gcd, "left_shift": torch.bitwise_left_shift, "right_shift": torch.bitwise_right_shift,
    "rand": philox.rand, "randn": philox.randn, "randint64": philox.randint64,
}


def _truncdiv(a: Any, b: Any) -> torch.Tensor:
    """a / b rounded toward zero. Integer division by -1 negates (wrapping at the smallest
    value): torch's own integer kernel traps on INT_MIN / -1. Division by zero raises as in eager."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if torch.promote_types(a.dtype, b.dtype).is_floating_point or a.dtype == torch.bool:
        return torch.div(a, b, rounding_mode="trunc")
    minus_one = b == -1
    quotient = torch.div(a, torch.where(minus_one, torch.ones_like(b), b), rounding_mode="trunc")
    return torch.where(minus_one, torch.neg(a).to(quotient.dtype), quotient)


class KernelRuntimeError(RuntimeError):
    """A check failed while a kernel ran: integer division by zero (ZeroDivisionError, as
    eager on CPU). Out-of-range indirect indices raise `IndexError`."""


_REDUCE = {
    # Reduced dims are the trailing ones: prod (which takes one dim) reduces them flattened.
    "sum": lambda v, dims, dtype: v.sum(dims, dtype=dtype),
    "prod": lambda v, dims, dtype: v.flatten(dims[0]).prod(-1, dtype=dtype),
    "max": lambda v, dims, dtype: _extremum(v, dims, dtype, True),
    "min": lambda v, dims, dtype: _extremum(v, dims, dtype, False),
}


def _extremum(v: torch.Tensor, dims: tuple[int, ...], dtype: torch.dtype, largest: bool) -> torch.Tensor:
    """amax/amin; over no element, the identity (-inf/+inf, the dtype's bounds, False/True: any
    and all over an empty dim, the only max/min reductions loopir lowers over one)."""
    if v.numel() or not v.shape or all(v.shape[d] for d in dims):
        return v.amax(dims) if largest else v.amin(dims)
    shape = [n for d, n in enumerate(v.shape) if d not in dims]
    if dtype == torch.bool:
        return torch.full(shape, not largest, dtype=dtype)
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    fill = (-float("inf") if largest else float("inf")) if dtype.is_floating_point else (info.min if largest else info.max)
    return torch.full(shape, fill, dtype=dtype)


def _welford(v: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, m2, weight) of `v` over `dims` (ops.reduction's "welford"), by two passes: the
    reference a one-pass codegen is checked against. Over no values: NaN, 0, 0."""
    count = 1
    for d in dims:
        count *= v.shape[d]
    mean = v.mean(dims, keepdim=True) if dims else v
    m2 = ((v - mean) * (v - mean)).sum(dims) if dims else torch.zeros_like(v)
    return mean.squeeze(dims) if dims else mean, m2, torch.full_like(m2, count)


_SCAN = {
    "sum": lambda v: torch.cumsum(v, -1, dtype=v.dtype),
    "prod": lambda v: torch.cumprod(v, -1, dtype=v.dtype),
    "max": lambda v: torch.cummax(v, -1).values if v.shape[-1] else v,
    "min": lambda v: torch.cummin(v, -1).values if v.shape[-1] else v,
    "logaddexp": lambda v: torch.logcumsumexp(v, -1),
}


class TorchHandler(OpsHandler):
    """Computes a loop body on whole tensors of index values."""

    def __init__(self, buffers: dict[str, torch.Tensor], env: dict[sympy.Symbol, Any],
                 shape: tuple[int, ...], reduced_dims: int, location: str = "") -> None:
        self.location = location  # the kernel and buffer being computed, for error messages
        self.buffers = buffers
        self.env = env
        self.shape = shape
        self.reduced_dims = reduced_dims

    def load(self, name: str, index: sympy.Expr) -> torch.Tensor:
        return self.buffers[name][torch.as_tensor(eval_index(index, self.env))]

    def store(self, name: str, index: sympy.Expr, value: torch.Tensor) -> None:
        idx = torch.broadcast_to(torch.as_tensor(eval_index(index, self.env)), self.shape)
        buf = self.buffers[name]
        buf[idx] = torch.broadcast_to(torch.as_tensor(value), self.shape).to(buf.dtype)

    def reduction(self, name: str, reduction_type: str, dtype: torch.dtype, value: Any) -> torch.Tensor:
        dims = tuple(range(len(self.shape) - self.reduced_dims, len(self.shape)))
        if reduction_type in ("argmax", "argmin"):
            values, positions = (torch.broadcast_to(torch.as_tensor(v), self.shape) for v in value)
            if not dims:
                return positions
            values = values.to(torch.uint8 if dtype == torch.bool else dtype)  # torch's argmax refuses bool
            values, positions = values.flatten(dims[0]), positions.flatten(dims[0])
            pick = values.argmax(-1) if reduction_type == "argmax" else values.argmin(-1)
            return positions.gather(-1, pick.unsqueeze(-1)).squeeze(-1)
        value = torch.broadcast_to(torch.as_tensor(value), self.shape).to(dtype)
        if reduction_type == "welford":
            return _welford(value, dims)
        if not dims:
            return value
        return _REDUCE[reduction_type](value, dims, dtype)

    def scan(self, name: str, scan_type: str, dtype: torch.dtype, value: Any) -> torch.Tensor:
        # A Scan node's one scanned dim is the last of the iteration space.
        if scan_type in ("argmax", "argmin"):
            values, positions = (torch.broadcast_to(torch.as_tensor(v), self.shape) for v in value)
            if not self.shape[-1]:
                return positions
            pick = torch.cummax if scan_type == "argmax" else torch.cummin
            return positions.gather(-1, pick(values.to(dtype), -1).indices)
        value = torch.broadcast_to(torch.as_tensor(value), self.shape).to(dtype)
        return _SCAN[scan_type](value)

    def scatter(self, name: str, index: sympy.Expr, value: Any, mode: str) -> None:
        """Indirect stores in source order (CPU index_put/scatter_reduce: eager's own order)."""
        idx = torch.broadcast_to(torch.as_tensor(eval_index(index, self.env)), self.shape).reshape(-1)
        buf = self.buffers[name]
        compute = torch.uint8 if buf.dtype == torch.bool else buf.dtype  # bool: or/and as max/min
        value = torch.broadcast_to(torch.as_tensor(value), self.shape).reshape(-1).to(buf.dtype).to(compute)
        target = buf.to(compute)
        if mode == "store":
            target.index_put_((idx,), value)
        elif mode == "sum" and buf.dtype != torch.bool:
            target.index_put_((idx,), value, accumulate=True)
        else:
            reduce = {"sum": "amax", "prod": "amin" if buf.dtype == torch.bool else "prod",
                      "max": "amax", "min": "amin"}[mode]
            target.scatter_reduce_(0, idx, value, reduce)
        buf.copy_(target)

    def store_reduction(self, name: str, index: sympy.Expr, value: torch.Tensor) -> None:
        # The output index does not depend on reduction variables: their axes have size 1 in
        # it, so it is indexed on the outer shape even when a reduction range is empty.
        outer = self.shape[:len(self.shape) - self.reduced_dims]
        idx = torch.as_tensor(eval_index(index, self.env))
        idx = torch.broadcast_to(idx, outer + (1,) * self.reduced_dims).reshape(outer)
        buf = self.buffers[name]
        buf[idx] = torch.broadcast_to(value, outer).to(buf.dtype)

    def constant(self, value: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(value, dtype=dtype)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(eval_index(expr, self.env)).to(dtype)

    def to_dtype(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.to(dtype)

    def where(self, cond: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(cond, a, b)

    def indirect_indexing(self, value: torch.Tensor, size: sympy.Expr) -> sympy.Symbol:
        symbol = indirect_var(sum(s.name.startswith("ind") for s in self.env))
        value = torch.as_tensor(value).to(torch.int64)
        bound = int(eval_index(size, self.env))  # a size: no index variable in it
        wrapped = torch.where(value < 0, value + bound, value)
        outside = (wrapped < 0) | (wrapped >= bound)
        if outside.any():
            raise IndexError(f"{self.location}: index {int(value[outside][0])} is out of bounds for a dimension "
                             f"of size {bound}")
        self.env[symbol] = wrapped
        return symbol


def _torch_op(name: str):
    fn = _TORCH_FUNCS[name]

    def op(self: TorchHandler, *args: torch.Tensor) -> torch.Tensor:
        return fn(*args)

    op.__name__ = name
    return op


for _name in _TORCH_FUNCS:
    setattr(TorchHandler, _name, _torch_op(_name))


def _flat_storage(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of `t`'s memory from its first element to its last."""
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride())) if t.numel() else 0
    return t.as_strided((span,), (1,), t.storage_offset())


def _check_layout(kernel: Kernel, spec: BufferSpec, t: torch.Tensor, bindings: dict) -> None:
    """Loads index inputs with the traced strides: a tensor laid out otherwise would be read
    wrongly, so it is refused (only dims whose size and stride the bindings determine)."""
    if t.dim() != len(spec.size) or t.dtype != spec.dtype:
        raise ValueError(f"{kernel.name}: input {spec.name} expects {spec}, got {t.dtype} of shape {tuple(t.shape)}")
    bound = set(bindings)
    for dim, (size, stride) in enumerate(zip(spec.size, spec.stride)):
        if not free_size_symbols([size, stride]) <= bound:
            continue
        want_size, want_stride = evaluate_expr(size, bindings), evaluate_expr(stride, bindings)
        if t.shape[dim] != want_size or (want_size > 1 and t.stride(dim) != want_stride):
            raise ValueError(f"{kernel.name}: input {spec.name} dim {dim} has size {t.shape[dim]} and stride "
                             f"{t.stride(dim)}, the kernel was built for {want_size} and {want_stride} "
                             "(pass tensors with the traced layout, or re-lower)")


def _grid(ranges: Sequence[int], prefix_vars: Sequence[sympy.Symbol], rank: int, start: int) -> dict:
    env = {}
    for k, (var, n) in enumerate(zip(prefix_vars, ranges)):
        shape = [1] * rank
        shape[start + k] = n
        env[var] = torch.arange(n, dtype=torch.int64).view(shape)
    return env


def evaluate_kernel(kernel: Kernel, args: Sequence[Any]) -> tuple[torch.Tensor, ...]:
    """Run `kernel` on `args` (input tensors, then one int per size symbol)."""
    n_in = len(kernel.inputs)
    if len(args) != n_in + len(kernel.symbols):
        raise TypeError(f"{kernel.name} takes {n_in} tensors and {len(kernel.symbols)} sizes, got {len(args)} args")
    bindings = {s: int(v) for s, v in zip(kernel.symbols, args[n_in:])}
    for spec, t in zip(kernel.inputs, args[:n_in]):
        _check_layout(kernel, spec, t, bindings)
    buffers = {spec.name: _flat_storage(t) for spec, t in zip(kernel.inputs, args[:n_in])}
    results = {}
    for node in kernel.nodes:
        size = [evaluate_expr(s, bindings) for s in node.spec.size]
        stride = [evaluate_expr(s, bindings) for s in node.spec.stride]
        results[node.name] = torch.empty_strided(size, stride, dtype=node.spec.dtype)
        buffers[node.name] = _flat_storage(results[node.name])
        if isinstance(node.body, Scatter):  # starts as a copy of its base (same layout)
            buffers[node.name].copy_(buffers[node.body.base])
        ranges = [evaluate_expr(s, bindings) for s in node.ranges]
        rranges = [evaluate_expr(s, bindings) for s in node.reduction_ranges]
        rank = len(ranges) + len(rranges)
        ivars, rvars = index_vars(len(ranges)), index_vars(len(rranges), "r")
        env: dict[sympy.Symbol, Any] = dict(bindings)
        env.update(_grid(ranges, ivars, rank, 0))
        env.update(_grid(rranges, rvars, rank, len(ranges)))
        where = f"{kernel.name}, buffer {node.name}" + (f" (from {', '.join(node.origins)})" if node.origins else "")
        handler = TorchHandler(buffers, env, tuple(ranges) + tuple(rranges), len(rranges), where)
        try:
            node.run(handler, ivars, rvars)
        except RuntimeError as error:
            if "ZeroDivisionError" not in str(error) or isinstance(error, KernelRuntimeError):
                raise
            raise KernelRuntimeError(f"{where}: ZeroDivisionError (integer division or remainder by "
                                     "zero)") from error
    return tuple(results[o.name] for o in kernel.outputs)
