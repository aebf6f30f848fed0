"""The built-in tables. Each function returns a fresh DecompTable; nothing is cached or
registered globally, so a caller may derive its own tables freely.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch._decomp
from torch._ops import OpOverload

from .decomp_matmul import addmm_bias_epilogue
from .kiln_decompositions import CORE_ATEN_FIXES, kiln_table
from .ops import aten_overloads
from .opsets import LOOP_LEVEL_OPS
from .table import DecompTable

log = logging.getLogger(__name__)

# torch._decomp.decomposition_table entries that loop_level() adds on top of core_aten():
# composite ops torch keeps whole in its Core ATen opset but that end in loop-level ops.
# Several are already in core_aten() on some torch versions; listing them keeps
# loop_level() independent of that. Names missing from this torch are skipped.
_LOOP_LEVEL_TORCH_OPS = (
    # forward
    "_softmax", "_log_softmax", "_safe_softmax", "gelu", "silu", "hardswish",
    "hardsigmoid", "hardtanh", "leaky_relu", "elu", "softplus", "mish",
    "addcmul", "addcdiv", "lerp.Scalar", "lerp.Tensor", "rsub.Scalar", "rsub.Tensor",
    "clamp_min", "clamp_max", "native_layer_norm", "linalg_vector_norm", "logsumexp",
    "std.correction", "native_batch_norm", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit", "_native_batch_norm_legit.no_stats",
    "_native_batch_norm_legit_functional", "mse_loss",
    "zeros_like", "ones_like", "native_group_norm", "embedding", "split_with_sizes",
    "repeat", "addmv", "native_dropout", "triu_indices", "tril_indices",
    "upsample_bilinear2d", "upsample_bilinear2d.vec", "upsample_bicubic2d",
    "upsample_bicubic2d.vec", "upsample_trilinear3d", "upsample_trilinear3d.vec",
    "upsample_linear1d", "upsample_linear1d.vec", "grid_sampler_2d", "narrow_copy", "view_copy",
    "permute_copy", "as_strided_copy", "as_strided_scatter", "diagonal_scatter", "dist",
    "_batch_norm_with_update_functional", "_batch_norm_no_update", "batch_norm_backward",
    # backward
    "_softmax_backward_data", "_log_softmax_backward_data", "gelu_backward",
    "silu_backward", "hardswish_backward", "hardsigmoid_backward", "hardtanh_backward",
    "leaky_relu_backward", "elu_backward", "softplus_backward", "threshold_backward",
    "sigmoid_backward", "tanh_backward", "native_layer_norm_backward",
    "native_batch_norm_backward", "mse_loss_backward", "native_group_norm_backward",
    "embedding_dense_backward",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class CompositeImplicitDecomposition:
    """torch's CompositeImplicitAutograd kernel of ``op``, as torch's core table runs it.

    torch builds a new function object for these entries on every call; wrapping them
    makes two ``core_aten()`` tables compare (and hash) equal.
    """

    op: OpOverload
    fn: Callable[..., Any] = field(compare=False, repr=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _stable(op: OpOverload, fn: Callable[..., Any]) -> Callable[..., Any]:
    if isinstance(fn, functools.partial) and fn.keywords.get("kernel") is op:
        return CompositeImplicitDecomposition(op, fn)
    return fn


def core_aten() -> DecompTable:
    """torch's Core ATen decompositions (``torch._decomp.core_aten_decompositions()``),
    provenance ``"torch"``, except for the few ops in ``CORE_ATEN_FIXES`` whose torch
    entry cannot be traced on some inputs: kiln's entry replaces it (provenance ``"kiln"``).

    Only aten-namespace OpOverloads are taken: the torch function also lists
    CompositeImplicitAutograd ops of whatever other libraries happen to be loaded
    (quantized, mkldnn, user namespaces), which would make the table depend on import
    order. Entries torch builds afresh per call (CompositeImplicitAutograd kernels) are
    wrapped in ``CompositeImplicitDecomposition`` so equal tables compare equal.
    """
    fixes = {op: fn for fn in CORE_ATEN_FIXES for op in fn.decomposes}
    torch_entries = DecompTable(_core_aten_entries(), provenance="torch")
    return torch_entries | DecompTable(fixes, provenance="kiln")


@functools.cache
def _core_aten_entries() -> dict[OpOverload, Callable[..., Any]]:
    # Built once per process: torch's function walks every CompositeImplicitAutograd
    # op of the dispatcher (~0.1 s a call), and the aten entries cannot change.
    source = torch._decomp.core_aten_decompositions()
    entries = {
        op: _stable(op, fn)
        for op, fn in source.items()
        if isinstance(op, OpOverload) and op.namespace == "aten"
    }
    log.debug("core_aten: %d of %d torch entries kept", len(entries), len(source))
    return entries


def loop_level(*, bias_epilogues: bool = False) -> DecompTable:
    """Decompositions towards ``LOOP_LEVEL_OPS``, the opset kiln's loopir lowers.

    ``core_aten() | <torch decompositions of loop-friendly composites> | <kiln ones>``,
    then ``.keep(LOOP_LEVEL_OPS)``: ops of the opset are never decomposed, even by a
    table later united with this one (see ``DecompTable.keep``).

    ``bias_epilogues``: ``addmm(bias, a, b)`` becomes ``mm(a, b) + bias`` (the add fuses
    into the next kernel) instead of staying whole; ``addmm`` is then not kept.
    """
    torch_ops = aten_overloads(_LOOP_LEVEL_TORCH_OPS)
    source = torch._decomp.decomposition_table
    torch_extra = {op: source[op] for op in torch_ops if op in source}
    missing = sorted(str(op) for op in torch_ops if op not in source)
    if missing:
        log.debug("loop_level: no torch decomposition for %s", ", ".join(missing))
    extra = DecompTable(torch_extra, provenance="torch")
    table = core_aten() | extra | kiln_table()
    if not bias_epilogues:
        return table.keep(LOOP_LEVEL_OPS)
    epilogues = DecompTable({aten_op: addmm_bias_epilogue for aten_op in addmm_bias_epilogue.decomposes},
                            provenance="kiln")
    return (table | epilogues).keep(LOOP_LEVEL_OPS - set(addmm_bias_epilogue.decomposes))
