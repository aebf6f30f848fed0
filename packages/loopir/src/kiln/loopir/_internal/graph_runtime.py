"""What a `KernelGraph`'s module calls at run time besides its kernels and externs: the layout
check of its inputs and the views of its buffers.

Kept apart from the graph builder so that running a compiled graph (kiln's whole-graph cache
re-creates its module from node targets such as `ensure_layout`) imports no lowering.
"""

from __future__ import annotations

import logging

import torch
import torch.fx.node

log = logging.getLogger(__name__)


def ensure_layout(tensor: torch.Tensor, stride: list[int]) -> torch.Tensor:
    """`tensor` if it has the strides the graph was traced with, else a copy that has them.

    Kernels and views compute addresses from traced strides, and an eager op between regions
    may return another layout than its fake-tensor meta said; a copy keeps results right.
    """
    actual = tensor.stride()
    if actual == tuple(stride):  # the common case, checked first: this runs on every call
        return tensor
    if len(actual) != len(stride):
        raise ValueError(f"graph input has {len(actual)} dims (shape {tuple(tensor.shape)}), "
                         f"the graph was compiled for {len(stride)}; compile it again for this input")
    if all(a == e or n <= 1 for a, e, n in zip(actual, stride, tensor.shape)):
        return tensor
    log.debug("input of shape %s has strides %s, kernels expect %s: copying", tuple(tensor.shape), actual,
              tuple(stride))
    # A traced stride of 0 (an expanded input) reads one element along that dim: copy that
    # slice into a layout with the other strides, then expand it (a copy into overlapping
    # memory is refused).
    broadcast = [dim for dim, (st, n) in enumerate(zip(stride, tensor.shape)) if st == 0 and n > 1]
    source = tensor
    for dim in broadcast:
        source = source.narrow(dim, 0, 1)
    copy = torch.empty_strided(source.shape, stride, dtype=tensor.dtype, device=tensor.device).copy_(source)
    return copy.expand(tensor.shape) if broadcast else copy


def ensure_layouts(tensors: tuple[torch.Tensor, ...], strides: tuple[tuple[int, ...], ...]
                   ) -> tuple[torch.Tensor, ...]:
    """`ensure_layout` of each of `tensors` (a graph's inputs of known strides), in one call:
    `tensors` itself when every one has its strides (one comparison each)."""
    for tensor, stride in zip(tensors, strides):
        if tensor.stride() != stride:
            return tuple(ensure_layout(t, list(s)) for t, s in zip(tensors, strides))
    return tensors


def strided_view(tensor: torch.Tensor, size: list[int], stride: list[int], offset: int) -> torch.Tensor:
    """`tensor` seen with new sizes/strides; `offset` counts from tensor's first element."""
    return tensor.as_strided(size, stride, tensor.storage_offset() + offset)


# torch's C++ view constructor without the dispatcher (what Inductor's wrappers call): 3 vs 6 us
# per view on a CPU, and a compiled graph makes each of its views on every call. It records no
# autograd view (no `_base`), so only views the graph's own kernels and externs read use it.
_REINTERPRET_TENSOR = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "_reinterpret_tensor", None)
_REINTERPRET = _REINTERPRET_TENSOR or (lambda tensor, size, stride, offset: strided_view(tensor, size, stride, offset))


def internal_view(tensor: torch.Tensor, size: list[int], stride: list[int], offset: int) -> torch.Tensor:
    """`strided_view` for a view only the graph reads (never returned). A view autograd records
    (a tensor requiring grad, in grad mode: an extern's result then has a history) is torch's."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return strided_view(tensor, size, stride, offset)
    return _REINTERPRET(tensor, size, stride, offset)


def restrided_buffer(tensor: torch.Tensor, size: list[int], stride: list[int], offset: int) -> torch.Tensor:
    """`strided_view`'s elements as a tensor of its own over `tensor`'s storage, not a view of
    `tensor` (a kernel's or an extern's buffer nothing else holds): all of its elements (a value
    computed in memory order) or some (a padded matmul's result cut back to the rows eager
    computes): eager's result is no view, and a view returned through an `autograd.Function`
    could not be modified in place. A view whose elements overlap (an expand) stays a view, as
    eager's."""
    if any(st == 0 and n > 1 for n, st in zip(size, stride)):
        return strided_view(tensor, size, stride, offset)
    if _REINTERPRET_TENSOR is not None:  # the same tensor of its own, without the dispatcher: 0.7 vs 3.5 us
        return _REINTERPRET_TENSOR(tensor, size, stride, offset)  # (offset: from tensor's first element)
    result = torch.empty((0,), dtype=tensor.dtype, device=tensor.device)
    return result.set_(tensor.untyped_storage(), tensor.storage_offset() + offset, size, stride)


def copied_view(tensor: torch.Tensor, size: list[int], stride: list[int], offset: int) -> torch.Tensor:
    """`strided_view`'s elements copied into a tensor of their own, in the same dim order."""
    return strided_view(tensor, size, stride, offset).clone()


def stored_inputs(tensors: tuple[torch.Tensor, ...], written: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """`tensors`, graph inputs kernels stored their new values into (`Kernel.stored_inputs`),
    once those kernels ran: `written` holds the kernels' outputs, each its input itself when the
    runtime passed it as the output's storage, or a view of it with its layout (a kernel buffer in
    another dim order, read back with the input's strides). A copy (`ensure_layout` copied an input of another
    layout, or a runtime that allocates its outputs) is copied back into its input. Version
    counters move as an in-place op's do (autograd's checks of saved tensors)."""
    stored = []
    for tensor, value in zip(tensors, written):
        if value is tensor or _same_elements(value, tensor):
            stored.append(tensor)
        else:
            tensor.copy_(value)
    if stored:
        _INCREMENT_VERSION(stored)
    return tensors


def _same_elements(value: torch.Tensor, tensor: torch.Tensor) -> bool:
    """Whether `value` addresses exactly `tensor`'s elements (same memory, sizes and strides)."""
    return (value.data_ptr() == tensor.data_ptr() and value.dtype == tensor.dtype and value.shape == tensor.shape
            and value.stride() == tensor.stride() and value.device == tensor.device)


_INCREMENT_VERSION = torch._C._increment_version  # what torch.autograd.graph.increment_version calls

# A write: FX's dead-code elimination keeps its call when nothing reads the result (an inference
# graph returns the input itself, not this call's result).
_mark_side_effect = getattr(torch.fx.node, "has_side_effect", None)
if _mark_side_effect is not None:
    _mark_side_effect(stored_inputs)
