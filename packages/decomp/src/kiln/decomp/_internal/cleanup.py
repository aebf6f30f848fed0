"""Removal of the dead nodes that decompositions leave behind.

torch's decompositions sometimes build values they do not use (an ``empty`` reserve
tensor in batch norm, ``new_zeros`` placeholders for unused outputs). Those would make
``check_opset`` fail for ops nobody computes, so they are removed. Only nodes that are
safe to drop go: no mutation in their schema, no random-number consumption (dropping an
unused ``rand`` would change the random stream of the ops after it), no collective (every
rank must issue the same collectives).
"""

from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx
from torch._ops import OpOverload

from .node_kinds import is_symbolic_scalar_op

log = logging.getLogger(__name__)

# torch.distributed's functional collectives: every rank issues them, used or not.
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d"})


def is_pure_op(op: OpOverload) -> bool:
    """No mutation in its schema, no random numbers drawn, not a collective: two calls with the
    same arguments are interchangeable, and an unused call can go."""
    return (not op._schema.is_mutable and torch.Tag.nondeterministic_seeded not in op.tags
            and op.namespace not in COLLECTIVE_NAMESPACES)


def _removable(node: fx.Node) -> bool:
    if node.op != "call_function" or node.users:
        return False
    target = node.target
    if target is operator.getitem:
        return True
    if isinstance(target, OpOverload):
        return is_pure_op(target)
    # symbolic-size arithmetic (operator.mul on SymInts, torch.sym_max, ...) is pure
    return is_symbolic_scalar_op(node)


def eliminate_dead_pure_nodes(graph: fx.Graph) -> int:
    """Erase unused pure call_function nodes (repeatedly, last to first); return the count."""
    removed = 0
    for node in reversed(list(graph.nodes)):
        if _removable(node):
            graph.erase_node(node)
            removed += 1
    if removed:
        log.debug("removed %d dead nodes left by decompositions", removed)
    return removed
