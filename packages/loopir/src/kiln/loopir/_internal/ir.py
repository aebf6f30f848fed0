"""IR records: buffers, loop bodies and fused kernels. All are small frozen dataclasses.

A loop body is an `inner_fn` written against an ops handler (see `ops.py`):

* `Pointwise.inner_fn(ops, index) -> value` computes one element at `index`.
* `Reduction.inner_fn(ops, index, rindex) -> value` computes one element to be reduced.

`ComputedBuffer.run(ops, index, rindex)` wraps a body with its store, so any handler sees a
complete statement list: loads, math, (reduction), store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from .ops import Printer, ReadsWrites
from .sizes import Expr, contiguous_strides, flat_index, index_vars


@dataclasses.dataclass(frozen=True, slots=True)
class BufferSpec:
    """A named tensor a kernel reads or writes: dtype, sizes and strides as sympy expressions."""

    name: str
    dtype: torch.dtype
    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]

    @staticmethod
    def contiguous(name: str, dtype: torch.dtype, size: Sequence[Expr]) -> BufferSpec:
        return BufferSpec(name, dtype, tuple(size), contiguous_strides(size))

    def __str__(self) -> str:
        dims = ", ".join(str(s) for s in self.size)
        return f"{self.name}: {str(self.dtype).removeprefix('torch.')}[{dims}]"


@dataclasses.dataclass(frozen=True, slots=True)
class Pointwise:
    """One element per point of `ranges`."""

    ranges: tuple[Expr, ...]
    inner_fn: Callable[..., Any]
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True, slots=True)
class Reduction:
    """One element per point of `ranges`, reducing `inner_fn` over `reduction_ranges`."""

    ranges: tuple[Expr, ...]
    reduction_ranges: tuple[Expr, ...]
    reduction_type: str  # "sum" | "max" | "min"
    inner_fn: Callable[..., Any]
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True, slots=True)
class ComputedBuffer:
    """A buffer defined by a loop body; `spec` is its (contiguous) layout."""

    spec: BufferSpec
    body: Pointwise | Reduction
    origins: tuple[str, ...] = ()  # names of the ATen nodes this buffer computes

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ranges(self) -> tuple[Expr, ...]:
        return self.body.ranges

    @property
    def reduction_ranges(self) -> tuple[Expr, ...]:
        return self.body.reduction_ranges if isinstance(self.body, Reduction) else ()

    def run(self, ops: Any, index: Sequence[Expr], rindex: Sequence[Expr] = ()) -> Any:
        """Emit the whole body, store included, on `ops`.

        Index variables of size-1 ranges are replaced by 0, so every access is written in
        the variables that actually vary (a `[4, 1]` buffer is stored at `i0`, not `i0 + i1`).
        """
        index = _pin_unit_dims(index, self.ranges)
        rindex = _pin_unit_dims(rindex, self.reduction_ranges)
        out_index = flat_index(index, self.spec.stride)
        if isinstance(self.body, Pointwise):
            return ops.store(self.name, out_index, self.body.inner_fn(ops, tuple(index)))
        value = self.body.inner_fn(ops, tuple(index), tuple(rindex))
        acc = ops.reduction(self.name, self.body.reduction_type, self.body.dtype, value)
        return ops.store_reduction(self.name, out_index, acc)

    def accesses(self) -> ReadsWrites:
        handler = ReadsWrites()
        self.run(handler, index_vars(len(self.ranges)), index_vars(len(self.reduction_ranges), "r"))
        return handler

    def __str__(self) -> str:
        printer = Printer()
        self.run(printer, index_vars(len(self.ranges)), index_vars(len(self.reduction_ranges), "r"))
        kind = type(self.body).__name__
        head = f"{self.spec} = {kind}(ranges={list(self.ranges)}"
        if isinstance(self.body, Reduction):
            head += f", reduction_ranges={list(self.body.reduction_ranges)}, {self.body.reduction_type}"
        return head + ")\n" + "\n".join("    " + line for line in printer.lines)


def _pin_unit_dims(index: Sequence[Expr], ranges: Sequence[Expr]) -> tuple[Expr, ...]:
    return tuple(sympy.Integer(0) if r == 1 else i for i, r in zip(index, ranges))


@dataclasses.dataclass(frozen=True, slots=True)
class Kernel:
    """Fused loop nest: every node shares the outer `ranges`, run in order per point.

    Called as ``kernel(*inputs, *symbol_values)`` it returns a tuple of new tensors, one per
    entry of `outputs`; calling a `Kernel` object runs the reference evaluator, and codegens
    replace it with a compiled function of the same signature.
    """

    name: str
    nodes: tuple[ComputedBuffer, ...]
    inputs: tuple[BufferSpec, ...]
    outputs: tuple[BufferSpec, ...]
    symbols: tuple[sympy.Symbol, ...]

    @property
    def __name__(self) -> str:  # FX names call_function targets by __name__
        return self.name

    @property
    def ranges(self) -> tuple[Expr, ...]:
        return self.nodes[0].ranges

    @property
    def temporaries(self) -> tuple[ComputedBuffer, ...]:
        """Nodes whose buffer never leaves the kernel (codegen keeps them in registers)."""
        out = {o.name for o in self.outputs}
        return tuple(n for n in self.nodes if n.name not in out)

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        from .evaluate import evaluate_kernel

        return evaluate_kernel(self, args)

    def __str__(self) -> str:
        lines = [f"kernel {self.name}({', '.join(str(i) for i in self.inputs)}"
                 f"{''.join(', ' + str(s) for s in self.symbols)}) -> ({', '.join(o.name for o in self.outputs)})"]
        for node in self.nodes:
            lines += ["  " + line for line in str(node).splitlines()]
        return "\n".join(lines)

    def __hash__(self) -> int:
        return hash(self.name)
