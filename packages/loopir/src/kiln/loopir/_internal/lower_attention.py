"""Attention kernels as extern calls: the fused scaled-dot-product attention ops (flash,
memory-efficient, cuDNN, and the CPU flash kernel) and their backward ops.

Like a matmul, attention stays a library kernel, but inside loopir's region: a graph with one
attention per transformer layer is then one region, not one per layer with an eager call
between (each boundary costs the wrapper host time on every call, and made every HF model on
a GPU report its attention as an eager fallback). These ops return tuples; only the results
the graph reads get buffers (see `LoweringContext.add_multi_extern`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from .registry import Lowerings

aten = torch.ops.aten
TABLE = Lowerings()

_NAMES = (
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
)
# Every one this torch has (2.11 and 2.13 have them all; a build without one just lacks it).
ATTENTION_OPS = tuple(getattr(aten, name).default for name in _NAMES if hasattr(aten, name))


def results_lowerable(node: fx.Node) -> bool:
    """Whether every result the graph reads is a tensor or an int: a symbolic max sequence
    length read by a later op (a backward under dynamic shapes) stays with eager."""
    values = node.meta.get("val")
    if not isinstance(values, (tuple, list)):
        return False
    for user in node.users:
        if user.target is not operator.getitem:
            return False
        value = values[user.args[1]]
        if not isinstance(value, (torch.Tensor, int)) or isinstance(value, bool):
            return False
    return True


@TABLE.register("extern", *ATTENTION_OPS, check=results_lowerable)
def lower_attention(ctx: Any, node: fx.Node, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    return ctx.add_multi_extern(node, args, kwargs)
