"""Dense attention masks: a mask the fused attention kernels cannot read is made contiguous first.

`scaled_dot_product_attention` picks its kernel (cuDNN, flash, memory-efficient, or the math
fallback: two batched matmuls and a softmax, in float32 for 16-bit inputs) from its arguments'
layouts as well as their values. The fused kernels read a mask along its last dim: a mask whose
last stride is not 1 sends the call to the math fallback. Hugging Face models build such masks
while compiled: BERT's padding mask is an expanded boolean view, (8, 1, 512, 512) with strides
(0, 512, 1, 0), where eager BERT (which checks that the mask is all ones and drops it) runs
cuDNN attention. On an H200, BERT 6L d768 8x512 in bfloat16 then ran its attention as float32
SIMT matmuls (about 1.1 ms per forward, against 0.12 ms of cuDNN attention in eager), kiln and
Inductor alike (both trace the same choice): 0.77x and 0.82x eager.

`densify_attention_masks` inserts `.contiguous()` on such a boolean mask (same values, a dense
layout: a few MB at most) on the devices given, so tracing picks the fused kernel eager picks for
a dense mask of those values. One semantic difference is mended: a query row whose mask row is
all False gets zeros from the math fallback (its safe softmax) but not from cuDNN attention
(6% of a test's outputs differed, by up to 0.76): the output is `where(mask.any(-1), out, 0)`,
so every value is the math fallback's up to rounding.

Training graphs (`additive=True`) get an additive mask instead of the dense boolean one: 0 where
the mask is True, the output dtype's lowest finite value where it is False (`additive_mask`),
which the fused kernels take with their backward (memory-efficient attention). A boolean mask
would make a fully masked row's probabilities exp(-inf + inf), NaN, in the fused backward; with a
finite value the row's probabilities are uniform instead, its output is zeroed by the same
`where`, so its output gradient is zero and so is everything the backward computes from it
(dS = P * (dP - rowsum(dO * O)) = 0): every value and gradient is the math fallback's up to
rounding. Partially masked rows are unchanged: exp(lowest - max) is exactly 0. On an H200 the
AMP BERT step ran its attention as float32 SIMT matmuls without this (18.0 ms, Inductor 13.6).

float32 attention is left as it is where float32 matmuls may use TF32 (`torch.backends.cuda.
matmul.allow_tf32`, set by `torch.set_float32_matmul_precision("high")`): the fused kernels'
float32 forms use no tensor cores, while the math fallback's batched matmuls run on TF32 ones.
On an H200 (BERT 6L d768 8x512, fp32 training step, `tools/profile_training.py`) the dense mask
sent attention to the memory-efficient kernels: 61 ms a step against Inductor's 44 (BENCHMARKS.md
session 23).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.fx as fx

_SDPA = torch._C._nn.scaled_dot_product_attention
ENABLED = os.environ.get("KILN_DENSE_ATTENTION_MASKS", "1") != "0"  # 0: masks left as they are
_MASK_POSITION = 3  # (query, key, value, attn_mask, ...)


def _mask_argument(node: fx.Node) -> tuple[str | int, fx.Node] | None:
    if "attn_mask" in node.kwargs:
        mask = node.kwargs["attn_mask"]
        return ("attn_mask", mask) if isinstance(mask, fx.Node) else None
    if len(node.args) > _MASK_POSITION and isinstance(node.args[_MASK_POSITION], fx.Node):
        return _MASK_POSITION, node.args[_MASK_POSITION]
    return None


def _unreadable(mask: torch.Tensor) -> bool:
    """A boolean mask the fused kernels refuse for its layout alone: its last dim is not contiguous."""
    return mask.dtype == torch.bool and mask.dim() > 0 and mask.shape[-1] > 1 and mask.stride(-1) != 1


def _math_is_faster(result: torch.Tensor) -> bool:
    """float32 attention where float32 matmuls may use TF32: the math fallback runs on tensor
    cores, the fused kernels' float32 forms do not (see the module docstring)."""
    return result.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32


def _fake(value: torch.Tensor, compute):
    """`compute()` in the fake mode `value` belongs to (Dynamo's example values are fake)."""
    mode = getattr(value, "fake_mode", None)
    if mode is None:
        return compute()
    with mode:
        return compute()


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A dense `dtype` tensor of `mask`'s shape: 0 where `mask` is True, dtype's lowest finite
    value where it is False."""
    lowest = torch.full(mask.shape, torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return lowest.masked_fill(mask, 0)  # contiguous whatever the mask's strides (where() would keep them)


def densify_attention_masks(gm: fx.GraphModule, devices: Sequence[str] = ("cuda",), additive: bool = False) -> int:
    """Make every boolean attention mask of `gm` on `devices` that the fused kernels cannot
    read dense (contiguous, or with `additive` an additive mask of the output's dtype: for
    training graphs), and zero the output rows whose mask row is all False (see the module
    docstring); returns how many calls changed. Reads Dynamo's `meta["example_value"]`; a call
    without them is left alone."""
    changed = 0
    graph = gm.graph
    for node in list(graph.nodes) if ENABLED else ():
        if node.op != "call_function" or node.target is not _SDPA:
            continue
        found = _mask_argument(node)
        if found is None:
            continue
        where, mask = found
        value, result = mask.meta.get("example_value"), node.meta.get("example_value")
        if (not isinstance(value, torch.Tensor) or not isinstance(result, torch.Tensor)
                or value.device.type not in devices or not _unreadable(value) or _math_is_faster(result)):
            continue
        with graph.inserting_before(node):
            if additive:
                dense = graph.call_function(additive_mask, (mask, result.dtype))
                dense.meta["example_value"] = _fake(value, lambda mask=value, dtype=result.dtype: additive_mask(mask, dtype))
            else:
                dense = graph.call_method("contiguous", (mask,))
                dense.meta["example_value"] = _fake(value, value.contiguous)
        if where == "attn_mask":
            node.update_kwarg("attn_mask", dense)
        else:
            node.update_arg(where, dense)
        with graph.inserting_after(node):
            keep = graph.call_method("any", (mask, -1), {"keepdim": True})
        with graph.inserting_after(keep):
            zeroed = graph.call_function(torch.where, (keep, node, 0.0))
        kept = _fake(value, lambda mask=value: mask.any(-1, keepdim=True))
        keep.meta["example_value"] = kept
        zeroed.meta["example_value"] = _fake(result, lambda out=result, rows=kept: torch.where(rows, out, 0.0))
        for added in (dense, keep, zeroed):
            added.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_all_uses_with(zeroed, delete_user_cb=lambda user, new=zeroed: user is not new)
        changed += 1
    if changed:
        gm.recompile()
    return changed
