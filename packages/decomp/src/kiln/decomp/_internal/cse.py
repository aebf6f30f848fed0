"""Common-subexpression elimination of pure ATen nodes.

Traced graphs repeat work the user's code wrote once. HF Llama's attention computes its input
norm once, but each of q_proj, k_proj and v_proj views it again (`view(norm, [B*S, D])` three
times): three equal nodes. A loop-level backend that materializes each view for its matmul then
computes the norm three times, in three kernels. Merging equal nodes first leaves one.

Two nodes are equal when they call the same pure op on the same arguments (argument nodes by
identity, constants by value and type). Not merged, since two calls differ even with equal
arguments: ops with a mutable schema, random ops (each draws new numbers), collectives (each rank
issues each one), and uninitialized allocations (`empty*`: two buffers a later op may fill
differently). Graphs that mutate (a functionalized graph's only writes are the copies into mutated
inputs at its end) are merged only up to their first mutating node: past it, equal arguments may
hold other values, and a merged copy could be written twice. Two equal values that each reach the
graph's outputs (directly or through views) stay apart too: eager returns two tensors, and one
merged tensor would make them aliases (two parameters' equal gradients would share one `.grad`,
and an in-place update of one, as gradient clipping does, would change the other).
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch.fx as fx
from torch._ops import OpOverload

from .cleanup import is_pure_op

log = logging.getLogger(__name__)

_VIEWS_UNDECLARED = frozenset({"_unsafe_view"})  # views whose schema does not say so
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                            "empty_permuted"})


def _mergeable(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, OpOverload):
        return False
    return is_pure_op(target) and target._schema.name.split("::")[-1] not in _UNINITIALIZED


def _reaching_outputs(graph: fx.Graph) -> set[fx.Node]:
    """The nodes whose storage a graph output shares: outputs, and the bases they view."""
    reached: set[fx.Node] = set()
    stack = [n for n in graph.nodes if n.op == "output"]
    stack = [a for out in stack for a in out.all_input_nodes]
    while stack:
        node = stack.pop()
        if node in reached:
            continue
        reached.add(node)
        target = node.target
        viewing = target is operator.getitem or (isinstance(target, OpOverload) and (
            target.is_view or target._schema.name.split("::")[-1] in _VIEWS_UNDECLARED))
        if viewing and node.args and isinstance(node.args[0], fx.Node):
            stack.append(node.args[0])
    return reached


def _mutates(node: fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, OpOverload) and node.target._schema.is_mutable


def _hashable(value: Any) -> Any:
    """`value` as a key: nodes by identity, containers element-wise, constants with their type
    (1, 1.0 and True are equal in Python, not as ATen arguments)."""
    if isinstance(value, fx.Node):
        return ("node", id(value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_hashable(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _hashable(v)) for k, v in value.items())))
    if isinstance(value, float) and value != value:  # NaN: equal to no NaN, but the same argument
        return ("nan",)
    return (type(value).__name__, value)


def eliminate_common_subexpressions(graph: fx.Graph) -> int:
    """Replace each pure node equal to an earlier one by that one, in place; return how many.

    Nodes are visited in order, so arguments are already merged when their users are keyed."""
    seen: dict[Any, fx.Node] = {}
    outputs = _reaching_outputs(graph)
    merged = 0
    for node in list(graph.nodes):
        if _mutates(node):
            break
        if not _mergeable(node):
            continue
        try:
            key = (node.target, _hashable(node.args), _hashable(node.kwargs))
            hash(key)
        except TypeError:  # an argument that cannot be compared by value (a tensor constant, ...)
            continue
        first = seen.setdefault(key, node)
        if first is node or (node in outputs and first in outputs):
            continue
        node.replace_all_uses_with(first)
        graph.erase_node(node)
        merged += 1
    if merged:
        log.debug("merged %d nodes equal to earlier ones", merged)
    return merged
