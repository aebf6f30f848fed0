"""kiln decompositions built on indexing: embedding (a gather), its backward (a scatter-add
with ``index_put``), and the negative log-likelihood losses with their backward ops.

nll_loss picks ``-input[n, target[n]]`` with ``gather``; its backward writes the gradient
through a one-hot mask made by comparing ``arange(C)`` with the target, so it stays
pointwise (no scatter). Ignored targets (``ignore_index``) are replaced by class 0 before
any indexing and masked out of every sum, as eager skips them.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from .registry import aten, decomposes, scalar, to_dtype, zeros

log = logging.getLogger(__name__)

_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


@decomposes(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """weight[indices]: one gather of rows."""
    if weight.dim() != 2:
        return NotImplemented
    return aten.index.Tensor(weight, [indices])


@decomposes(aten.embedding_dense_backward.default)
def embedding_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    """Rows of the gradient summed into their weight rows (``index_put`` accumulate);
    the padding row gets nothing; with ``scale_grad_by_freq`` each row is divided by how
    often its index occurs."""
    dim = grad_output.shape[-1]
    flat_indices = aten.reshape.default(indices, [-1])
    grad = aten.reshape.default(grad_output, [-1, dim])
    if padding_idx >= 0:
        keep = aten.unsqueeze.default(aten.ne.Scalar(flat_indices, padding_idx), 1)
        grad = aten.where.self(keep, grad, scalar(0, grad))
    if scale_grad_by_freq:
        ones = aten.full.default(
            list(flat_indices.shape), 1, dtype=grad.dtype, device=grad.device, pin_memory=False
        )
        counts = aten.index_put.default(zeros([num_weights], grad), [flat_indices], ones, True)
        per_row = aten.index.Tensor(counts, [flat_indices])
        grad = aten.div.Tensor(grad, aten.unsqueeze.default(per_row, 1))
    return aten.index_put.default(zeros([num_weights, dim], grad), [flat_indices], grad, True)


def _safe_target(target: torch.Tensor, ignore_index: int) -> tuple[Any, Any]:
    """(mask of counted targets, targets with ignored ones replaced by class 0)."""
    keep = aten.ne.Scalar(target, ignore_index)
    return keep, aten.where.self(keep, target, scalar(0, target))


def _target_weights(weight: Any, safe: Any, keep: Any, like: torch.Tensor) -> Any:
    """Per-target class weight, 0 for ignored targets."""
    per_target = scalar(1.0, like) if weight is None else aten.index.Tensor(weight, [safe])
    return aten.where.self(keep, per_target, scalar(0.0, like))


@decomposes(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss(self, target, weight, reduction, ignore_index):
    """(loss, total_weight): -weight[t] * input[..., t, ...] over the class dim, reduced."""
    if self.dim() == 1:  # one sample: class dim 0, target 0-d
        # its 'sum' is its unreduced loss, and eager reports the target's weight as
        # total_weight even with reduction 'none'
        single = _REDUCTION_SUM if reduction == _REDUCTION_NONE else reduction
        batch = (aten.unsqueeze.default(self, 0), aten.unsqueeze.default(target, 0))
        return nll_loss(*batch, weight, single, ignore_index)
    keep, safe = _safe_target(target, ignore_index)
    picked = aten.squeeze.dims(aten.gather.default(self, 1, aten.unsqueeze.default(safe, 1)), [1])
    weights = _target_weights(weight, safe, keep, self)
    losses = aten.where.self(
        keep, aten.neg.default(aten.mul.Tensor(picked, weights)), scalar(0.0, self)
    )
    if reduction == _REDUCTION_NONE:
        return losses, scalar(0.0, self)
    total_weight = aten.sum.default(weights)
    loss = aten.sum.default(losses)
    if reduction == _REDUCTION_MEAN:
        loss = aten.div.Tensor(loss, total_weight)
    return loss, total_weight


@decomposes(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    """-weight[t] * grad (/ total_weight for mean) at each target class, 0 elsewhere."""
    keep, safe = _safe_target(target, ignore_index)
    grad = grad_output
    if reduction == _REDUCTION_MEAN:
        grad = aten.div.Tensor(grad_output, total_weight)
    coefficient = aten.mul.Tensor(aten.neg.default(_target_weights(weight, safe, keep, self)), grad)
    coefficient = aten.where.self(keep, coefficient, scalar(0.0, self))
    class_dim = 0 if self.dim() == 1 else 1
    classes = aten.arange.start_step(
        0, self.shape[class_dim], 1, dtype=target.dtype, device=target.device
    )
    if class_dim == 1:
        classes = aten.view.default(classes, [1, -1] + [1] * (self.dim() - 2))
        safe = aten.unsqueeze.default(safe, 1)
        coefficient = aten.unsqueeze.default(coefficient, 1)
    one_hot = aten.eq.Tensor(classes, safe)
    grad_input = aten.where.self(one_hot, coefficient, scalar(0.0, self))
    if list(grad_input.shape) != list(self.shape):  # e.g. 'none' grads of an empty batch
        grad_input = aten.expand.default(grad_input, list(self.shape))
    return to_dtype(grad_input, self.dtype)


@decomposes(aten.embedding_renorm.default)
def embedding_renorm(self, indices, max_norm, norm_type):
    """The functional embedding_renorm (``embedding(..., max_norm=)`` rescales the rows it
    reads): rows whose ``norm_type``-norm exceeds max_norm are scaled by
    max_norm / (norm + 1e-7), as eager does. A row read twice gets the same new value
    twice, so one index_put writes them all."""
    if not self.is_floating_point():
        return NotImplemented
    flat = aten.reshape.default(indices, [-1])
    rows = aten.index.Tensor(self, [flat])
    norms = aten.linalg_vector_norm.default(rows, norm_type, [1], True)
    scale = aten.mul.Scalar(aten.reciprocal.default(aten.add.Scalar(norms, 1e-7)), max_norm)
    scale = aten.where.self(aten.gt.Scalar(norms, max_norm), scale, aten.ones_like.default(scale))
    return aten.index_put.default(self, [flat], aten.mul.Tensor(rows, scale))


@decomposes(aten.fractional_max_pool2d_backward.default, aten.fractional_max_pool3d_backward.default)
def fractional_max_pool_backward(grad_output, self, kernel_size, output_size, indices):
    """Each output's gradient added to the input element its index names (a scatter-add over
    each plane, flat in the pooled dims, as eager's kernel adds them)."""
    pooled = len(output_size)
    planes = list(self.shape[: self.dim() - pooled])
    flat_grad = aten.reshape.default(grad_output, [*planes, -1])
    flat_indices = aten.reshape.default(indices, [*planes, -1])
    plane = math.prod(self.shape[self.dim() - pooled:])
    spread = aten.scatter_add.default(zeros([*planes, plane], grad_output), len(planes), flat_indices, flat_grad)
    return aten.reshape.default(spread, list(self.shape))


INDEXING_DECOMPOSITIONS = (
    fractional_max_pool_backward,
    embedding,
    embedding_backward,
    embedding_renorm,
    nll_loss,
    nll_loss_backward,
)
