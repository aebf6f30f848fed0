"""Region outputs no user sees: a training forward's saved tensors and mutated inputs' values.

A training forward's outputs leave through an `autograd.Function`, so loopir copies an output
that views a buffer the graph reads again (`copied_view`: the user may modify it in place). The
outputs autograd_trace's runtime never returns to the user (``meta[INTERNAL_OUTPUTS]``: tensors
saved for the backward, mutated inputs' new values) need no copy: each region is told which of
its outputs reach the graph's output only there (`loopir.LowerOptions.private_outputs`), and
such a view stays a view. On a GPU that is one copy kernel fewer per call for each (a batch
norm's saved statistics, each a view of its reduction's buffer).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch.fx as fx

PRIVATE_KEY = "kiln_private_outputs"  # region GraphModule meta: output positions no user sees


def mark_private_outputs(parted: fx.GraphModule, internal: Sequence[int]) -> None:
    """Record on each region of `parted` (``region.meta[PRIVATE_KEY]``) which of its outputs are
    private: returned by `parted` only at the positions `internal` (or not at all)."""
    if not internal:
        return
    outputs = parted.graph.output_node().args[0]
    flat = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    visible = {value for position, value in enumerate(flat) if position not in set(internal)}
    for call in parted.graph.nodes:
        if call.op != "call_module":
            continue
        region = parted.get_submodule(call.target)
        if not isinstance(region, fx.GraphModule):
            continue
        produced = region.graph.output_node().args[0]
        if not isinstance(produced, (tuple, list)):
            private = () if call in visible else (0,)
        else:
            reads = {user.args[1]: user for user in call.users if user.target is operator.getitem}
            private = tuple(k for k in range(len(produced)) if reads.get(k) not in visible)
        region.meta[PRIVATE_KEY] = private
