"""Decompositions written in kiln (provenance ``"kiln"``), for ops whose torch decomposition
is missing or leaves the loop-level opset (torch's var/var_mean end in ``prims.var``,
its clamp in ``isnan``/``bitwise_or``), and ``kiln_table()``, which gathers every kiln
decomposition: this module's, and those of the decomp_* modules (activations, norms,
indexing and losses, matmul).

Each function is marked with the ops it decomposes by ``@decomposes(...)`` right above it
(registry.py). A function returns ``NotImplemented`` for calls it does not handle; the op
then stays in the graph as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch._refs
from torch._prims_common import suggest_memory_format

from .decomp_activations import ACTIVATION_DECOMPOSITIONS
from .decomp_indexing import INDEXING_DECOMPOSITIONS
from .decomp_matmul import MATMUL_DECOMPOSITIONS
from .decomp_norms import NORM_DECOMPOSITIONS
from .layouts import dense_order, in_dim_order, rolls_nothing
from .registry import LOW_PRECISION as _LOW_PRECISION
from .registry import aten, decomposes
from .table import DecompTable

log = logging.getLogger(__name__)


def _reduction_dims(x: torch.Tensor, dim: Sequence[int] | int | None) -> list[int] | None:
    """Non-negative reduction dims; ``None``/``[]`` mean all dims. None if unsupported."""
    if isinstance(dim, int):
        dim = [dim]
    if dim is None or len(dim) == 0:
        return list(range(x.dim()))
    if x.dim() == 0:
        return None
    return sorted({d % x.dim() for d in dim})


def _var_and_mean(x: torch.Tensor, dims: list[int], correction: Any) -> tuple[Any, Any]:
    """(var, mean) over ``dims`` with keepdim=True, computed in at least float32.

    Two passes over the data shifted by its first element along ``dims`` (var(x) = var(x - x0)):
    values near the float maximum then neither overflow the mean's sum nor turn its rounding
    error into an overflowing square, and a large mean does not cancel a small spread, as
    eager's Welford. Empty reductions are not shifted (there is no first element)."""
    compute = x
    if x.dtype in _LOW_PRECISION:
        compute = aten._to_copy.default(x, dtype=torch.float32)
    count = 1
    for d in dims:
        count = count * x.shape[d]
    shift = None
    if all(x.shape[d] != 0 for d in dims):
        shift = compute
        for d in dims:
            shift = aten.slice.Tensor(shift, d, 0, 1)
        compute = aten.sub.Tensor(compute, shift)
    mean = aten.mean.dim(compute, dims, True)
    diff = aten.sub.Tensor(compute, mean)
    squares = aten.sum.dim_IntList(aten.mul.Tensor(diff, diff), dims, True)
    correction = 1 if correction is None else correction
    # torch divides by max(N - correction, 0): too few elements give inf/nan, not an error.
    var = aten.div.Tensor(squares, torch.sym_max(count - correction, 0))
    return var, mean if shift is None else aten.add.Tensor(mean, shift)


def _finish(t: torch.Tensor, dims: list[int], keepdim: bool, dtype: torch.dtype) -> Any:
    if not keepdim and dims:
        t = aten.squeeze.dims(t, dims)
    if t.dtype != dtype:
        t = aten._to_copy.default(t, dtype=dtype)
    return t


@decomposes(aten.var_mean.correction)
def var_mean_correction(x, dim=None, *, correction=None, keepdim=False):
    """var_mean as sub, mean, sub, mul, sum, div (two passes over shifted data)."""
    dims = _reduction_dims(x, dim)
    if dims is None or not x.is_floating_point():
        return NotImplemented
    var, mean = _var_and_mean(x, dims, correction)
    return _finish(var, dims, keepdim, x.dtype), _finish(mean, dims, keepdim, x.dtype)


@decomposes(aten.var.correction)
def var_correction(x, dim=None, *, correction=None, keepdim=False):
    """var as sub, mean, sub, mul, sum, div."""
    return _variance(x, dim, correction, keepdim, root=False)


@decomposes(aten.std.correction)
def std_correction(x, dim=None, *, correction=None, keepdim=False):
    """std as the square root of var (torch's own divides by a symbolic float under dynamic shapes)."""
    return _variance(x, dim, correction, keepdim, root=True)


def _variance(x: torch.Tensor, dim: Any, correction: Any, keepdim: bool, *, root: bool) -> Any:
    dims = _reduction_dims(x, dim)
    if dims is None or not x.is_floating_point():
        return NotImplemented
    var, _ = _var_and_mean(x, dims, correction)
    return _finish(aten.sqrt.default(var) if root else var, dims, keepdim, x.dtype)


def _clamp_dtype(x: torch.Tensor, bounds: Sequence[Any]) -> torch.dtype | None:
    """Result dtype of clamp(x, scalar bounds) by torch's type promotion; None if complex."""
    if x.is_complex() or any(isinstance(b, complex) for b in bounds):
        return None
    if x.is_floating_point():
        return x.dtype
    if any(isinstance(b, (float, torch.SymFloat)) for b in bounds):
        return torch.get_default_dtype()
    if x.dtype == torch.bool and any(not isinstance(b, (bool, torch.SymBool)) for b in bounds):
        return torch.int64
    return x.dtype


@decomposes(aten.clamp.default)
def clamp_scalar(x, min=None, max=None):  # argument names are ATen's (calls pass them by keyword)
    """clamp with scalar bounds as maximum/minimum with 0-d tensors; NaN propagates as in
    eager, and min > max gives max everywhere (minimum is applied last)."""
    bounds = [b for b in (min, max) if b is not None]
    dtype = _clamp_dtype(x, bounds)
    if not bounds or dtype is None:
        return NotImplemented
    out = x if x.dtype == dtype else aten._to_copy.default(x, dtype=dtype)
    if min is not None:
        out = aten.maximum.default(
            out, aten.scalar_tensor.default(min, dtype=dtype, device=x.device)
        )
    if max is not None:
        out = aten.minimum.default(
            out, aten.scalar_tensor.default(max, dtype=dtype, device=x.device)
        )
    return out


@decomposes(aten.clamp.Tensor)
def clamp_tensor(x, min=None, max=None):  # argument names are ATen's (calls pass them by keyword)
    """clamp with tensor bounds as maximum/minimum (which broadcast and promote alike)."""
    if min is None and max is None:
        return NotImplemented
    out = x
    if min is not None:
        out = aten.maximum.default(out, min)
    if max is not None:
        out = aten.minimum.default(out, max)
    return out


@decomposes(aten.full_like.default)
def full_like(
    x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None
):
    """full_like as full of x's shape (permuted to x's dim order when x is dense but not
    contiguous, so the result has x's strides like eager's)."""
    if x.layout != torch.strided or layout not in (None, torch.strided):
        return NotImplemented
    if memory_format not in (None, torch.preserve_format, torch.contiguous_format):
        return NotImplemented
    order = list(range(x.dim()))
    if memory_format != torch.contiguous_format and not x.is_contiguous():
        order = dense_order(x)
        if order is None:
            return NotImplemented
    filled = aten.full.default(
        [x.shape[d] for d in order],
        fill_value,
        dtype=x.dtype if dtype is None else dtype,
        layout=torch.strided,
        device=x.device if device is None else device,
        pin_memory=pin_memory,
    )
    if order == list(range(x.dim())):
        return filled
    return aten.permute.default(filled, sorted(range(x.dim()), key=order.__getitem__))


@decomposes(aten.copy.default)
def copy(self, src, non_blocking=False):
    """The functional copy: src converted to self's dtype and broadcast to its shape."""
    if self.device != src.device or self.is_complex() != src.is_complex():
        return NotImplemented
    value = src if src.dtype == self.dtype else aten._to_copy.default(src, dtype=self.dtype)
    expanded = aten.expand.default(value, list(self.shape))
    # Laid out as `self`, whose storage eager's copy_ writes: a channels-last input written in
    # place stays channels-last, and so does what is computed from it (lerp follows it).
    order = dense_order(self, symbolic=True)
    return in_dim_order(expanded, list(range(self.dim())) if order is None else order)


@decomposes(aten.roll.default)
def roll(self, shifts, dims=()):
    """torch's reference roll, laid out as eager's: eager's CPU kernel is a `cat` of the two
    parts of the rolled dim, so it keeps the input's suggested memory format (channels-last stays
    channels-last), except where a shift is a multiple of its dim's size (one part is empty: cat
    of differing formats, contiguous; 39000458); several dims roll one after the other. torch's
    reference (and eager's CUDA kernel) returns a contiguous tensor. Without dims, eager rolls
    the flattened tensor: contiguous too."""
    rolled = torch._refs.roll(self, shifts, dims)
    memory_format = suggest_memory_format(self)
    if self.device.type != "cpu" or not dims or memory_format == torch.contiguous_format \
            or any(rolls_nothing(self.shape[d], shift) for shift, d in zip(shifts, dims)):
        return rolled
    return aten.clone.default(rolled, memory_format=memory_format)


@decomposes(aten.take.default)
def take(self, index):
    """self viewed as 1-D, gathered at ``index`` (one ``index`` op; torch's decomposition
    indexes from Python, which reads a 0-d index tensor's value and cannot be traced)."""
    return aten.index.Tensor(aten.reshape.default(self, [-1]), [index])


@decomposes(aten.new_empty_strided.default)
def new_empty_strided(self, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    """new_empty_strided as empty_strided with self's dtype and device as defaults."""
    return aten.empty_strided.default(
        size,
        stride,
        dtype=self.dtype if dtype is None else dtype,
        layout=layout,
        device=self.device if device is None else device,
        pin_memory=pin_memory,
    )


@decomposes(aten.unbind_copy.int)
def unbind_copy(self, dim=0):
    """One clone of each ``select`` along ``dim``. The traced op already returned that
    many tensors, so a symbolic size is specialized to its value (int() guards on it)."""
    count = int(self.shape[dim])
    return [aten.clone.default(aten.select.int(self, dim, i)) for i in range(count)]


@decomposes(aten._pad_circular.default)
def pad_circular(self, pad):
    """Circular padding as slices and one ``cat`` per padded dim (torch's composite kernel
    copies into slices of an empty tensor, in place). ``pad`` holds (left, right) pairs
    from the last dim backwards; negative amounts crop first, then the cropped tensor
    wraps around, as in eager."""
    out = self
    for i in range(len(pad) // 2):
        dim = self.dim() - 1 - i
        left, right = pad[2 * i], pad[2 * i + 1]
        size = out.shape[dim]
        start, end = max(-left, 0), size - max(-right, 0)
        if start or end != size:
            out = aten.slice.Tensor(out, dim, start, end)
        size = end - start
        pieces = []
        if left > 0:
            pieces.append(aten.slice.Tensor(out, dim, size - left, size))
        pieces.append(out)
        if right > 0:
            pieces.append(aten.slice.Tensor(out, dim, 0, right))
        if len(pieces) > 1:
            out = aten.cat.default(pieces, dim)
    return aten.clone.default(out) if out is self else out


@decomposes(aten.lift_fresh_copy.default)
def lift_fresh_copy(x):
    """lift_fresh_copy (a tensor constant made in the traced code) as clone."""
    return aten.clone.default(x)


BASIC_DECOMPOSITIONS = (
    var_mean_correction,
    var_correction,
    std_correction,
    clamp_scalar,
    clamp_tensor,
    full_like,
    copy,
    roll,
    take,
    new_empty_strided,
    unbind_copy,
    pad_circular,
    lift_fresh_copy,
)

KILN_DECOMPOSITIONS = (
    *BASIC_DECOMPOSITIONS,
    *ACTIVATION_DECOMPOSITIONS,
    *NORM_DECOMPOSITIONS,
    *INDEXING_DECOMPOSITIONS,
    *MATMUL_DECOMPOSITIONS,
)


# kiln entries that core_aten() uses instead of torch's, which fail on some inputs
CORE_ATEN_FIXES = (take,)


def kiln_table() -> DecompTable:
    """A fresh DecompTable of every kiln-written decomposition (provenance ``"kiln"``)."""
    entries = {op: fn for fn in KILN_DECOMPOSITIONS for op in fn.decomposes}
    return DecompTable(entries, provenance="kiln")
