"""Choosing what the forward saves as a minimum s-t cut (networkx max-flow).

The flow network has two vertices per forward-side node ``v`` (``v.in`` -> ``v.out``, with
capacity = bytes of ``v``'s storage: what saving ``v`` costs). Data edges ``u.out -> v.in``
and the source/sink edges have infinite capacity:

- ``source -> v.in`` for nodes the backward may not recompute (graph inputs, random ops,
  ops above the recompute level): they exist only where the forward computed them;
- ``v.out -> sink`` for nodes a backward-only node reads (or that are gradients themselves).

A finite cut crosses only ``v.in -> v.out`` edges: those ``v`` are saved. Everything on the
sink side of the cut is recomputed by the backward from saved values; the infinite data
edges guarantee that the inputs of every recomputed node are saved or recomputed themselves.
Sizes (SymInt nodes) are not part of the network: the backward gets every size it needs
saved as a plain value.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

import networkx as nx
import torch.fx

from .opclass import is_op_overload
from .recompute import RecomputePolicy, is_symbolic_value, recompute_recipe, storage_bytes

log = logging.getLogger(__name__)

SOURCE = "__source__"
SINK = "__sink__"


@dataclasses.dataclass(frozen=True, slots=True)
class CutResult:
    """The nodes to save, the cut's total bytes, and why each non-recomputable node is so."""

    saved: tuple[torch.fx.Node, ...]
    cut_bytes: int
    not_recomputable: dict[torch.fx.Node, str]


def min_cut_saved_values(
    forward_side: Iterable[torch.fx.Node],
    read_by_backward: set[torch.fx.Node],
    policy: RecomputePolicy,
) -> CutResult:
    """Cheapest set of forward-side nodes to save so the backward can get all it reads.

    ``forward_side`` are the joint nodes that do not depend on tangents (topological order);
    ``read_by_backward`` those of them that backward nodes or gradient outputs use.
    """
    region = [n for n in forward_side if not is_symbolic_value(n)]
    in_region = set(region)
    network = nx.DiGraph()
    not_recomputable: dict[torch.fx.Node, str] = {}
    for node in region:
        _add_node(network, node)
        recipe = recompute_recipe(node)
        reason = None if recipe else policy.why_not_recomputable(node)
        if reason is not None:
            not_recomputable[node] = reason
            network.add_edge(SOURCE, (node, "in"))
        for user_input in recipe.inputs if recipe else node.all_input_nodes:
            if user_input in in_region:
                network.add_edge((user_input, "out"), (node, "in"))
        if node in read_by_backward:
            network.add_edge((node, "out"), SINK)
    if SINK not in network or SOURCE not in network:
        return CutResult((), 0, not_recomputable)
    cut_value, (reachable, _) = nx.minimum_cut(network, SOURCE, SINK)
    if cut_value == float("inf"):
        raise AssertionError(
            "no finite cut: a value the backward needs can neither be saved nor recomputed"
        )
    saved = tuple(n for n in region if (n, "in") in reachable and (n, "out") not in reachable)
    log.debug(
        "min cut at level %s: %d bytes, saved %s", policy.name, cut_value, [n.name for n in saved]
    )
    return CutResult(saved, int(cut_value), not_recomputable)


def _add_node(network: nx.DiGraph, node: torch.fx.Node) -> None:
    nbytes = storage_bytes(node)
    if nbytes is None:
        # Tuples and other non-tensors cannot be saved whole: only their getitems can.
        network.add_edge((node, "in"), (node, "out"))
    else:
        # Tie-breakers between equal byte counts: fewer saved tensors (+1 each), and a view's
        # base rather than the view (+1 more), so the backward re-derives views.
        network.add_edge((node, "in"), (node, "out"), capacity=nbytes + 1 + _is_view(node))


def _is_view(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and is_op_overload(node.target) and node.target.is_view
