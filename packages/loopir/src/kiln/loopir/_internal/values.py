"""What an ATen node lowers to: a strided view of a buffer, or a lazy (unrealized) loop body.

Views never copy: a `StridedView` changes sizes/strides/offset of the buffer it reads, and a
`Lazy` value composes index functions. Either can be read at any index through `load`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from .sizes import Expr, contiguous_strides, flat_index


@dataclasses.dataclass(frozen=True, slots=True)
class StridedView:
    """A buffer (graph input, parameter or realized result) seen through sizes/strides/offset."""

    buffer: str
    dtype: torch.dtype
    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]
    offset: Expr = sympy.Integer(0)

    def load(self, ops: Any, index: Sequence[Expr]) -> Any:
        return ops.load(self.buffer, flat_index(index, self.stride, self.offset))

    def is_contiguous(self) -> bool:
        return all(s == 1 or st == c for s, st, c in
                   zip(self.size, self.stride, contiguous_strides(self.size)))


@dataclasses.dataclass(frozen=True, slots=True)
class Lazy:
    """A not-yet-realized pointwise value: `inner_fn(ops, index)` computes one element."""

    dtype: torch.dtype
    size: tuple[Expr, ...]
    inner_fn: Callable[[Any, tuple[Expr, ...]], Any]
    origins: tuple[str, ...] = ()
    # the dtype `inner_fn` computes in, when not `dtype`: float32 for a bfloat16/float16 value
    # that is rounded only where it is stored (see `sizes.compute_dtype`)
    computed: torch.dtype | None = None

    def load(self, ops: Any, index: Sequence[Expr]) -> Any:
        return self.inner_fn(ops, tuple(index))

    @property
    def value_dtype(self) -> torch.dtype:
        """The dtype of what `load` returns."""
        return self.computed or self.dtype


Value = StridedView | Lazy


def as_lazy(value: Value, size: Sequence[Expr], index_fn: Callable[[tuple[Expr, ...]], tuple[Expr, ...]],
            origin: str) -> Lazy:
    """A view of `value` expressed as an index function: output index -> index into `value`."""

    def inner(ops: Any, index: tuple[Expr, ...]) -> Any:
        return value.load(ops, index_fn(index))

    origins = value.origins if isinstance(value, Lazy) else ()
    computed = value.computed if isinstance(value, Lazy) else None
    return Lazy(value.dtype, tuple(size), inner, origins + (origin,), computed)
