"""Dense layouts of fake tensors: their dim order, and a decomposition's result put back into the
layout of the op it replaced.

A decomposition may lay its result out otherwise than eager's kernel (kiln's group_norm ends in
a view of a contiguous value where eager's CPU kernel keeps a channels-last input channels-last;
a softmax of a channels-last tensor is contiguous in eager, its ``exp / sum`` channels-last).
Decompositions downstream read those strides: torch's ``lerp`` ends in a ``prims.copy_strided``
to the strides TensorIterator gives its operands, a ``*_like`` op copies them. So each
decomposed value is given the layout the graph recorded for its node (eager's), and the graph
computes what eager's strides would give.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten


def dense_order(x: torch.Tensor, symbolic: bool = False) -> list[int] | None:
    """Dims of a non-overlapping, dense ``x`` from outermost to innermost stride; None when
    ``x`` is not dense, or (unless ``symbolic``) its strides are symbolic. Symbolic strides are
    ordered by the example's values and checked dense at every size (no shape guard added)."""
    hints = [hint(v) for v in (*x.shape, *x.stride())]
    if None in hints or (not symbolic and not all(isinstance(v, int) for v in (*x.shape, *x.stride()))):
        return None
    sizes, strides = hints[: x.dim()], hints[x.dim():]
    order = sorted(range(x.dim()), key=lambda d: (-strides[d], -sizes[d]))
    return order if is_dense_in_order(x, order) else None


def is_dense_in_order(x: torch.Tensor, order: list[int]) -> bool:
    """Whether ``x`` is dense with ``order`` its dims from outermost to innermost, at every size
    (a dim of size 1 may have any stride)."""
    expected: Any = 1
    for d in reversed(order):
        if not statically_known_true(x.shape[d] == 1) and not statically_known_true(x.stride(d) == expected):
            return False
        expected = expected * x.shape[d]
    return True


def hint(value: int | torch.SymInt) -> int | None:
    """An int, or the value a SymInt has in the example inputs (None: data-dependent)."""
    if isinstance(value, torch.SymInt):
        return int(value.node.hint) if value.node.has_hint() else None
    return int(value)


def in_dim_order(x: torch.Tensor, order: list[int]) -> Any:
    """A copy of ``x`` dense in ``order`` (outermost dim first): a contiguous clone of the
    permuted value, permuted back. ``x`` itself where ``order`` is the logical one."""
    if order == list(range(x.dim())):
        return aten.clone.default(x, memory_format=torch.contiguous_format)
    permuted = aten.clone.default(aten.permute.default(x, order), memory_format=torch.contiguous_format)
    return aten.permute.default(permuted, sorted(range(x.dim()), key=order.__getitem__))


def relayout_as_recorded(value: Any, recorded: Any) -> Any:
    """``value`` (a decomposition's result: a tensor or a tuple of them) with each tensor laid out
    as its ``recorded`` counterpart (the node's FakeTensor in the graph being decomposed) where
    that one is dense and ``value`` is not dense in the same dim order; else as it is."""
    if isinstance(value, (tuple, list)) and isinstance(recorded, (tuple, list)) and len(value) == len(recorded):
        return type(value)(relayout_as_recorded(v, r) for v, r in zip(value, recorded))
    if not (isinstance(value, FakeTensor) and isinstance(recorded, torch.Tensor)) or value.dim() < 2 \
            or value.dim() != recorded.dim() or value.dtype != recorded.dtype or value.layout != torch.strided:
        return value
    # size arithmetic on the recorded fakes (not traced values) is no part of the graph
    with disable_proxy_modes_tracing():
        order = dense_order(recorded, symbolic=True)
        keep = order is None or is_dense_in_order(value, order) \
            or not all(statically_known_true(a == b) for a, b in zip(value.shape, recorded.shape))
    return value if keep else in_dim_order(value, order)


def rolls_nothing(size: Any, shift: Any) -> bool:
    """Whether a roll by `shift` along a dim of `size` moves no element: eager's CPU roll then
    cats the whole dim with an empty part, a contiguous result whatever the input's layout. A
    symbolic one is decided with a shape guard: the output's layout depends on it."""
    return bool(size == 0) or bool(shift % size == 0)
