"""Linear layers with an odd number of outputs get a padded weight, so that cuBLAS reads and
writes rows whose length is a multiple of 16 bytes.

A language model's output layer has as many outputs as its vocabulary: 30522 for BERT, 50257
for GPT-2. Its logits, (tokens, 30522) float32, have rows of 122088 bytes, not a multiple of 16,
and cuBLAS then runs the matmuls that read or write them (the forward, and in training both
backward matmuls, which read the logits' gradient) with kernels for unaligned rows. On an H200
(BERT-base masked LM, 16x512 tokens, float32 with TF32) those three took about 3 ms each, against
about 1 ms for an aligned matrix of that size (BENCHMARKS.md session 23).

`pad_linear_outputs` rewrites each such call in Dynamo's graph, before AOTAutograd traces it:
``linear(x, w, b)`` becomes ``linear(x, pad(w), pad(b))[..., :n]``, the weight (and bias) padded
with zero rows up to a multiple of 8 (16 bytes in bfloat16, which autocast runs a float32 layer
in). The forward's output rows are then aligned (the result is a view of them), and the backward traced through the slice and the pad gets an
aligned gradient for both its matmuls; the weight's gradient is the padded one's first rows.
Every value is the unpadded linear's up to the summation order the kernel picks: the extra
outputs are zeros, never read. The pad costs a copy of the weight per call, so only weights of
at least `MIN_WEIGHT_ELEMENTS` are padded. Inductor pads matmuls too (its `pad_mm` pass).

On by default for CUDA linears (`KILN_PAD_LINEARS=0` turns it off). On an H200 (BERT-base
masked LM, 16x512 tokens, float32 with TF32, `tools/profile_training.py`) the step went from
53.0-56.7 to 46.7 ms (session 24; Inductor 44.8). Two loopir rules keep the padded logits from costing kiln
kernels time: nll_loss's backward one-hot is recomputed, not stored (`recompute.py`: a broadcast
of per-row values), and a bias padded and read back over the unpadded row is a contiguous read
(`simplify.py`: a clamp that never binds is dropped; before, the log-softmax over the padded
logits took 1.6 ms instead of 0.5). The weight gradient is the padded matmul's first rows, read
in place (`lower_indexing._cropped_view`), not copied.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F

from .attention_masks import _fake

_LINEAR = torch._C._nn.linear
# On unless KILN_PAD_LINEARS=0 (see the module docstring).
ENABLED = os.environ.get("KILN_PAD_LINEARS", "1") != "0"
ALIGNMENT_BYTES = 16
MIN_WEIGHT_ELEMENTS = 1 << 22  # 4M: an output layer of a real vocabulary, not a test model's
# Rows of the input (tokens) below which the matmul is bound by reading the weight, not by its
# arithmetic: there the unaligned kernels cost little and the pad's copy of the weight a lot (a
# decoding step's one token). At 8192 tokens the aligned matmul saves ~2 ms against a ~50 us pad.
MIN_ROWS = 1024


def padded_outputs(outputs: int) -> int:
    """`outputs` rounded up so that a row of that many values is a multiple of 16 bytes in any
    floating dtype a matmul runs in: 2-byte ones included, as autocast runs a float32 layer's
    matmul in bfloat16 (a multiple of 8 values)."""
    multiple = ALIGNMENT_BYTES // 2
    return -(-outputs // multiple) * multiple


def _pads(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, device_types: Sequence[str]) -> int:
    """How many zero rows `weight` gets (0: the call is left alone)."""
    if (weight.dim() != 2 or weight.device.type not in device_types or weight.dtype not in (
            torch.float32, torch.bfloat16, torch.float16)):
        return 0
    outputs, inputs = weight.shape
    if not isinstance(outputs, int) or not isinstance(inputs, int) or outputs * inputs < MIN_WEIGHT_ELEMENTS:
        return 0
    if not all(isinstance(s, int) for s in x.shape) or x.numel() < MIN_ROWS * inputs:
        return 0
    if bias is not None and (bias.dim() != 1 or bias.dtype != weight.dtype):
        return 0
    return padded_outputs(outputs) - outputs


def _padded_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, pad: int) -> tuple:
    """The rewritten call's values: the padded weight and bias, the wide output, its slice."""
    w_pad = F.pad(w, (0, 0, 0, pad))
    b_pad = None if b is None else F.pad(b, (0, pad))
    wide = _LINEAR(x, w_pad, b_pad)
    return w_pad, b_pad, wide, wide[..., :w.shape[0]]


def pad_linear_outputs(gm: fx.GraphModule, devices: Sequence[str] = ("cuda",)) -> int:
    """Rewrite every linear of `gm` on `devices` whose weight has an unaligned number of rows
    (see the module docstring); returns how many calls changed. Reads Dynamo's
    `meta["example_value"]`; a call without them is left alone."""
    changed = 0
    graph = gm.graph
    for node in list(graph.nodes) if ENABLED else ():
        if node.op != "call_function" or node.target is not _LINEAR or node.kwargs:
            continue
        x, w, b = (list(node.args) + [None, None])[:3]
        values = [a.meta.get("example_value") if isinstance(a, fx.Node) else None for a in (x, w, b)]
        if not all(isinstance(v, torch.Tensor) for v in values[:2]) or (b is not None and values[2] is None):
            continue
        pad = _pads(*values, devices)
        if not pad:
            continue
        examples = _fake(values[1], functools.partial(_padded_linear, *values, pad))
        keep = (Ellipsis, slice(None, values[1].shape[0]))
        with graph.inserting_before(node):
            added = [graph.call_function(F.pad, (w, (0, 0, 0, pad)))]
            if b is not None:
                added.append(graph.call_function(F.pad, (b, (0, pad))))
            wide = graph.call_function(_LINEAR, (x, added[0], added[1] if b is not None else None))
            sliced = graph.call_function(operator.getitem, (wide, keep))
        for new, example in zip((*added, wide, sliced), [e for e in examples if e is not None], strict=True):
            new.meta["example_value"] = example
            new.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_all_uses_with(sliced)
        graph.erase_node(node)
        changed += 1
    if changed:
        gm.recompile()
    return changed
