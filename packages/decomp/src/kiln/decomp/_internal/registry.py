"""How kiln-written decompositions are marked, and the small helpers they share.

A decomposition is a plain function taking the op's arguments (ATen names, so that calls
passing them by keyword work) and returning its outputs, or ``NotImplemented`` to leave a
call alone. ``@decomposes(op, ...)`` right above it records which ops it implements; no
registry is mutated: ``kiln_table()`` (kiln_decompositions.py) builds a fresh DecompTable
from the functions its modules list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload

log = logging.getLogger(__name__)
aten = torch.ops.aten

LOW_PRECISION = (torch.float16, torch.bfloat16)


def decomposes(*ops: OpOverload) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a function as the kiln decomposition of ``ops``."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.decomposes = ops  # type: ignore[attr-defined]
        return fn

    return mark


def to_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` converted to ``dtype`` (no node when it already has it)."""
    return x if x.dtype == dtype else aten._to_copy.default(x, dtype=dtype)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype eager CPU kernels compute in: float32 for float16/bfloat16."""
    return torch.float32 if dtype in LOW_PRECISION else dtype


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in its compute dtype."""
    return to_dtype(x, compute_dtype(x.dtype))


def scalar(value: Any, like: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor of ``like``'s dtype and device (for maximum/minimum/where)."""
    return aten.scalar_tensor.default(value, dtype=like.dtype, device=like.device)


def zeros(shape: Any, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A contiguous zero tensor of ``shape`` on ``like``'s device."""
    return aten.full.default(
        list(shape),
        0,
        dtype=dtype or like.dtype,
        layout=torch.strided,
        device=like.device,
        pin_memory=False,
    )


def sum_dims(x: torch.Tensor, dims: list[int], keepdim: bool = False) -> torch.Tensor:
    """Sum over ``dims``; an empty ``dims`` reduces nothing (ATen's ``sum.dim_IntList``
    would reduce every dim)."""
    if not dims:
        return x
    return aten.sum.dim_IntList(x, dims, keepdim)
