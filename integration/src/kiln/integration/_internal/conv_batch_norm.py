"""Batch norm folded into the convolution before it, on CPU inference graphs.

In eval mode a batch norm is a per-channel affine map of its input: `(y - mean) * invstd * gamma
+ beta`, with `invstd = rsqrt(var + eps)`. When `y` is a convolution's output, the map folds into
the convolution's weight and bias:

    scale = gamma * rsqrt(var + eps)
    conv(x, w * scale[:, None, None, None], (b - mean) * scale + beta)

and a ReLU (or hardtanh, ReLU6) after the batch norm runs inside the convolution as oneDNN's
post-op (`mkldnn._convolution_pointwise`, the op Inductor emits with `freezing=True`). The block
(ConvNets' conv + batch norm + ReLU) is then one convolution call and a small kernel over the
weights (C_out * C_in * kh * kw values): no pass over the activation at all, where eager makes
two and Inductor (default mode) one. The folded weights are computed on every call from the
graph's inputs, so parameters or running statistics that change between calls are always read
(no freezing, no cache keyed on versions).

Rounding: the folded weights round once more than eager's product chain; results agree with
eager's to float32 rounding of the convolution's sums (tests: `test_integration_conv_batch_norm.py`).

Only where every piece is known to hold: a 2-D, non-transposed float32 convolution on the CPU
whose output (eager's) is channels-last (the layout oneDNN's fused op returns, and its fake
kernel says), read by the batch norm alone, with oneDNN available and enabled; inference graphs
only (`pipeline.py`: a training graph's backward needs the unfolded convolution). The batch
norm's output may have other readers: then no post-op. `KILN_FOLD_CONV_BATCH_NORM=0` turns the
pass off.
"""

from __future__ import annotations

import operator
import os

import torch
import torch.fx as fx
from torch._prims_common import make_channels_last_strides_for

from .attention_masks import _fake

ENABLED = os.environ.get("KILN_FOLD_CONV_BATCH_NORM", "1") != "0"

aten = torch.ops.aten
_CONV = aten.convolution.default
_BATCH_NORM = aten._native_batch_norm_legit_no_training.default
_POST_OPS = {aten.relu.default: "relu", aten.hardtanh.default: "hardtanh"}


def _fused_conv():
    """oneDNN's convolution with a post-op, where this torch build has it and it is enabled."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    op = getattr(mkldnn, "_convolution_pointwise", None) if mkldnn is not None else None
    if op is None or not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return None
    return op.default


def _val(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _foldable(conv: fx.Node, norm: fx.Node) -> bool:
    if conv.target is not _CONV or len(conv.users) != 1 or len(conv.args) != 9:
        return False
    x, w, b = (_val(a) for a in conv.args[:3])
    out = _val(conv)
    if x is None or w is None or out is None or conv.args[6]:  # transposed
        return False
    if conv.args[2] is not None and b is None:
        return False
    params = [_val(a) for a in norm.args[1:5] if a is not None]
    if any(p is None for p in params) or not isinstance(norm.args[3], fx.Node) or not isinstance(norm.args[4], fx.Node):
        return False
    tensors = [x, w, out, *params, *([b] if b is not None else [])]
    if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
        return False
    if x.dim() != 4 or not all(isinstance(s, int) for s in (*out.shape, *w.shape)):
        return False
    return tuple(out.stride()) == tuple(make_channels_last_strides_for(out.shape))


def _outputs(norm: fx.Node) -> fx.Node | None:
    """The batch norm's normalized output (getitem 0), when its statistics outputs go unread."""
    result = None
    for user in norm.users:
        if user.op != "call_function" or user.target is not operator.getitem:
            return None
        if user.args[1] != 0:
            if user.users:
                return None
            continue
        result = user
    return result


def _post_op(normalized: fx.Node) -> tuple[fx.Node, str, list] | None:
    """The ReLU / hardtanh that alone reads the batch norm's output: (node, attr, scalars)."""
    if len(normalized.users) != 1:
        return None
    (user,) = normalized.users
    attr = _POST_OPS.get(user.target) if user.op == "call_function" else None
    if attr is None or user.args[0] is not normalized or user.kwargs:
        return None
    if attr == "hardtanh":
        low = user.args[1] if len(user.args) > 1 else -1.0  # aten.hardtanh's defaults
        high = user.args[2] if len(user.args) > 2 else 1.0
        if not all(isinstance(v, (int, float)) for v in (low, high)):
            return None
        return user, attr, [float(low), float(high)]
    return user, attr, []


def fold_conv_batch_norms(gm: fx.GraphModule) -> int:
    """Fold each eval batch norm of a CPU float32 channels-last convolution into it (see the module
    docstring); returns how many. Reads and writes `meta["val"]` (FakeTensors of the traced ATen
    graph)."""
    fused = _fused_conv() if ENABLED else None
    if fused is None:
        return 0
    graph = gm.graph
    folded = 0
    for norm in list(graph.nodes):
        if norm.op != "call_function" or norm.target is not _BATCH_NORM or not isinstance(norm.args[0], fx.Node):
            continue
        conv = norm.args[0]
        normalized = _outputs(norm)
        if normalized is None or _val(normalized) is None or not _foldable(conv, norm):
            continue
        post = _post_op(normalized)
        last = post[0] if post is not None else normalized
        x, w, b, stride, padding, dilation, _transposed, _output_padding, groups = conv.args
        _, gamma, beta, mean, var, _momentum, eps = norm.args
        stack = last.meta.get("stack_trace") or norm.meta.get("stack_trace")
        like = _val(conv)  # its fake mode computes the new nodes' values

        def call(target, *args, stack=stack, like=like):
            node = graph.call_function(target, args)
            node.meta["stack_trace"] = stack
            values = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
            node.meta["val"] = _fake(like, lambda: target(*values))
            return node

        with graph.inserting_before(norm):
            scale = call(aten.rsqrt.default, call(aten.add.Scalar, var, float(eps)))
            if gamma is not None:
                scale = call(aten.mul.Tensor, scale, gamma)
            channels = _val(w).shape[0]
            weight = call(aten.mul.Tensor, w, call(aten.view.default, scale, [channels, 1, 1, 1]))
            shift = call(aten.mul.Tensor, call(aten.sub.Tensor, b, mean) if b is not None else call(aten.neg.default, mean),
                         scale)
            bias = call(aten.add.Tensor, shift, beta) if beta is not None else shift
        with graph.inserting_after(last):
            attr, scalars = (post[1], post[2]) if post is not None else ("none", [])
            out = graph.call_function(fused, (x, weight, bias, list(padding), list(stride), list(dilation),
                                              groups, attr, scalars, ""))
        out.meta["val"] = last.meta["val"]
        out.meta["stack_trace"] = stack
        last.replace_all_uses_with(out)
        for dead in ([post[0]] if post is not None else []) + [normalized]:
            graph.erase_node(dead)
        for dead in list(norm.users):
            graph.erase_node(dead)
        graph.erase_node(norm)
        graph.erase_node(conv)
        folded += 1
    if folded:
        graph.lint()
        gm.recompile()
    return folded
