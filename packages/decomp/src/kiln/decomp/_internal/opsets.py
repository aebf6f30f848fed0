"""LOOP_LEVEL_OPS: the ATen opset that kiln's loopir lowers, and that ``loop_level()`` targets.

``decompose(gm, loop_level())`` rewrites a graph towards this set; an op of the set is
never decomposed by ``loop_level()``. Ops that neither the set nor the table covers stay
in the graph as they are (partition sends them to eager); ``check_opset`` finds them.

Besides the pointwise ops the design lists, the set holds ``erf``, ``expm1`` and
``log1p``: torch's own decompositions of gelu, elu, softplus and mish end in them, and
each is a single libm / libdevice call for a code generator.
"""

from __future__ import annotations

import logging

from .ops import aten_overloads

log = logging.getLogger(__name__)

_POINTWISE = (
    "add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar",
    "mul.Tensor", "mul.Scalar", "div.Tensor", "div.Scalar",
    "neg", "exp", "log", "sigmoid", "tanh", "relu", "abs", "sqrt", "rsqrt", "reciprocal",
    "erf", "expm1", "log1p",
    "pow.Tensor_Scalar", "maximum", "minimum", "where.self",
    "eq.Tensor", "eq.Scalar", "ne.Tensor", "ne.Scalar", "lt.Tensor", "lt.Scalar",
    "le.Tensor", "le.Scalar", "gt.Tensor", "gt.Scalar", "ge.Tensor", "ge.Scalar",
    "logical_not", "clone", "_to_copy", "scalar_tensor", "full",
)  # fmt: skip

_REDUCTIONS = (
    "sum.dim_IntList", "sum.default", "amax", "amin", "mean.dim", "mean.default",
)  # fmt: skip

_VIEWS = (
    "view", "_unsafe_view", "permute", "t", "transpose.int", "expand", "unsqueeze",
    "squeeze.dim", "squeeze.dims", "alias", "slice.Tensor", "select.int",
)  # fmt: skip

# Ops that stay whole and that loopir calls as Extern kernels. The attention variants
# are those of this torch (names missing from an older torch are skipped).
_EXTERNS = (
    "mm", "addmm", "bmm", "convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_attention_math",
    "sort", "sort.stable", "topk", "cumsum",
)  # fmt: skip

POINTWISE_OPS = aten_overloads(_POINTWISE)
REDUCTION_OPS = aten_overloads(_REDUCTIONS)
VIEW_OPS = aten_overloads(_VIEWS)
EXTERN_OPS = aten_overloads(_EXTERNS)

LOOP_LEVEL_OPS = POINTWISE_OPS | REDUCTION_OPS | VIEW_OPS | EXTERN_OPS
