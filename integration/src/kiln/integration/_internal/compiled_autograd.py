"""Compiled-autograd backward graphs: the calls in them that are not ATen ops.

With ``torch._dynamo.compiled_autograd._enable(compiler)`` the autograd engine hands the whole
backward pass to Dynamo as one graph (the backward of each autograd node, the hooks, and the
gradient accumulation into ``.grad``), calling the backend with it like any other graph. Most
of its nodes are opaque ``compiled_autograd.ops.<Node>`` calls that run ATen ops and trace
through; ``AccumulateGrad`` does not: it returns nothing when its parameter is a functional
tensor (the parameter does not require grad under functionalization), which would drop every
gradient. kiln replaces it with what it computes (torch's own polyfill of
``inductor::accumulate_grad_`` does the same): the new gradient copied into the parameter's
layout, plus the old gradient if there is one. Dynamo assigns the result to ``.grad`` after
the graph.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.fx as fx

log = logging.getLogger(__name__)

_OPS_MODULE = "torch._dynamo.compiled_autograd.ops"


def _is_compiled_autograd_op(target: object, name: str) -> bool:
    return getattr(target, "__module__", None) == _OPS_MODULE and getattr(target, "__name__", None) == name


def accumulate_grad(grads: Sequence[torch.Tensor | None], variable: torch.Tensor,
                    variable_grad: torch.Tensor | None, has_post_hooks: bool) -> list[torch.Tensor | None]:
    """``compiled_autograd.ops.AccumulateGrad``, written with ATen ops: the value ``.grad``
    takes. ``has_post_hooks`` changes nothing here: the hooks are calls of their own in the graph."""
    (new_grad,) = grads
    if new_grad is None:
        return [None if variable_grad is None else variable_grad.clone()]
    laid_out = torch.empty_like(variable, memory_format=torch.preserve_format)
    laid_out.copy_(new_grad)
    if variable_grad is None:
        return [laid_out]
    return [variable_grad + laid_out]


def rewrite_accumulate_grad(gm: fx.GraphModule) -> int:
    """Replace the ``AccumulateGrad`` calls of a compiled-autograd graph in place; returns how many."""
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and _is_compiled_autograd_op(node.target, "AccumulateGrad"):
            node.target = accumulate_grad
            count += 1
    if count:
        gm.recompile()
        log.debug("kiln: %d AccumulateGrad calls of a compiled-autograd graph written as ATen ops", count)
    return count
