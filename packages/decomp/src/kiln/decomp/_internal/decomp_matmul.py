"""kiln decompositions of linear and addbmm into the matrix-product externs.

``linear`` (CompositeImplicitAutograd) becomes one 2-D product of the input with its
leading dims flattened: ``addmm(bias, x2d, w.t())`` (the bias add is addmm's epilogue)
or ``mm`` without bias, viewed back. torch's own path depends on the input: ``addmm``
for 2-D, ``matmul`` (a ``bmm``/``mv`` plus a separate ``add``) for other ranks and
non-contiguous inputs. A backend that has a linear kernel keeps it with
``loop_level().keep([torch.ops.aten.linear])``.
"""

from __future__ import annotations

import logging
import math

from .registry import aten, decomposes

log = logging.getLogger(__name__)


@decomposes(aten.linear.default)
def linear(input, weight, bias=None):
    """x @ w.t() (+ bias) as one addmm / mm on x viewed as 2-D."""
    if weight.dim() != 2 or input.dim() == 0 or (bias is not None and bias.dim() > 1):
        return NotImplemented
    weight_t = aten.t.default(weight)
    if input.dim() == 2:
        flat = input
    else:
        rows = math.prod(input.shape[:-1])
        flat = aten.reshape.default(input, [rows, input.shape[-1]])
    out = (
        aten.mm.default(flat, weight_t)
        if bias is None
        else aten.addmm.default(bias, flat, weight_t)
    )
    if input.dim() == 2:
        return out
    return aten.view.default(out, [*input.shape[:-1], weight.shape[0]])


@decomposes(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    """beta * self + alpha * sum_b(batch1[b] @ batch2[b]) as one addmm: the batch folds into
    the contraction (``[b1[0] | b1[1] | ...] @ [b2[0]; b2[1]; ...]``), so the whole sum is one
    matrix product accumulated by the GEMM, not a bmm then a separate sum over b (which rounds
    each product first). self is ignored when beta == 0, as in eager."""
    if batch1.dim() != 3 or batch2.dim() != 3:
        return NotImplemented
    batches, rows, inner = batch1.shape
    cols = batch2.shape[2]
    lhs = aten.reshape.default(aten.permute.default(batch1, [1, 0, 2]), [rows, batches * inner])
    rhs = aten.reshape.default(batch2, [batches * inner, cols])
    if beta == 0:
        product = aten.mm.default(lhs, rhs)
        return product if alpha == 1 else aten.mul.Scalar(product, alpha)
    return aten.addmm.default(self, lhs, rhs, beta=beta, alpha=alpha)


@decomposes(aten.addmm.default)
def addmm_bias_epilogue(self, mat1, mat2, *, beta=1, alpha=1):
    """``mm`` then the bias add as a pointwise op, which a loop-level backend fuses into the
    kernel that reads the product (an epilogue), instead of the GEMM's own. GEMM libraries
    pick faster kernels for a plain ``mm`` (cuBLAS on an H200: 128x128 tiles for BERT's
    linears instead of 64x64), and the bias costs no pass of its own. One rounding either
    way (the product, then the add). Only ``beta == alpha == 1``; other addmms stay whole.
    Not in ``loop_level()`` by default: ``loop_level(bias_epilogues=True)``."""
    if beta != 1 or alpha != 1:
        return NotImplemented
    return aten.add.Tensor(aten.mm.default(mat1, mat2), self)


MATMUL_DECOMPOSITIONS = (linear, addbmm)
