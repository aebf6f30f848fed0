"""Which nodes form which region: classification, ordering constraints, depths.

Each call node is classified as supported or not (with a reason). Every node then gets a
depth: an unsupported node takes the largest depth among its inputs; a supported node takes
the largest of d(i) over supported inputs and d(i) + 1 over the others (placeholders and
get_attr have depth 0). All supported nodes of one depth form one region. Along any path the
depth never decreases and it grows when the path leaves a region through an unsupported
node, so no path can leave a region and come back: the regions are acyclic, and
independent regions of equal depth merge horizontally. One pass, linear in the edges.

Side effects add ordering edges that count as inputs here (and in the final scheduling): a
barrier (input mutation, assert, ...) follows every call since the previous barrier and
precedes every later call; random ops follow the previous random op.
"""

from __future__ import annotations

import logging
import operator
from collections import defaultdict
from dataclasses import dataclass

import torch.fx as fx

from .effects import CALL_OPS, is_barrier, is_random, mutates_input
from .meta import VAL
from .predicates import Supported

logger = logging.getLogger(__name__)

NOT_SUPPORTED = "not supported by predicate"
MUTATES_INPUT = "mutates an input"


@dataclass(frozen=True, slots=True)
class RegionPlan:
    """The outcome of planning, before any graph is built."""

    regions: tuple[tuple[fx.Node, ...], ...]  # kept regions, each in original order
    dissolved: tuple[tuple[fx.Node, ...], ...]  # regions smaller than min_size
    unsupported: tuple[tuple[fx.Node, str], ...]  # (node, reason), in original order
    order_deps: dict[fx.Node, tuple[fx.Node, ...]]  # extra predecessors from side effects


def plan_regions(graph: fx.Graph, supported: Supported, min_size: int) -> RegionPlan:
    """Classify, order and group the call nodes of `graph` into regions."""
    reasons = classify(graph, supported)
    order_deps = ordering_deps(graph)
    depths = assign_depths(graph, reasons, order_deps)
    by_depth: dict[int, list[fx.Node]] = defaultdict(list)
    for node, reason in reasons.items():
        if reason is None:
            by_depth[depths[node]].append(node)
    groups = sorted((tuple(nodes) for nodes in by_depth.values()), key=lambda g: depths[g[0]])
    kept = tuple(g for g in groups if len(g) >= min_size)
    dissolved = tuple(g for g in groups if len(g) < min_size)
    unsupported = tuple((n, r) for n, r in reasons.items() if r is not None)
    logger.debug(
        "planned %d regions (%d dissolved by min_size=%d), %d unsupported nodes",
        len(kept),
        len(dissolved),
        min_size,
        len(unsupported),
    )
    return RegionPlan(kept, dissolved, unsupported, order_deps)


def classify(graph: fx.Graph, supported: Supported) -> dict[fx.Node, str | None]:
    """Call node -> None when it may go in a region, else the reason it may not."""
    reasons: dict[fx.Node, str | None] = {}
    for node in graph.nodes:
        if node.op not in CALL_OPS:
            continue
        producer = _multi_output_producer(node)
        if mutates_input(node):
            reasons[node] = MUTATES_INPUT
        elif producer is not None:
            # Unpacking a tuple belongs with the op that made the tuple.
            follows = reasons.get(producer)
            reasons[node] = None if follows is None else f"unpacks unsupported {producer.name}"
        else:
            reasons[node] = None if _ask(supported, node) else NOT_SUPPORTED
    return reasons


def _multi_output_producer(node: fx.Node) -> fx.Node | None:
    if node.op != "call_function" or node.target is not operator.getitem:
        return None
    source = node.args[0]
    if not isinstance(source, fx.Node) or source.op not in CALL_OPS:
        return None
    return source if isinstance(source.meta.get(VAL), (tuple, list)) else None


def _ask(supported: Supported, node: fx.Node) -> bool:
    try:
        return supported(node)
    except Exception as error:
        raise RuntimeError(
            f"partition: predicate {supported!r} raised on node {node.name!r} "
            f"({node.format_node()}): {error}"
        ) from error


def ordering_deps(graph: fx.Graph) -> dict[fx.Node, tuple[fx.Node, ...]]:
    """Extra predecessors that keep side effects in place (linear in the number of nodes)."""
    deps: dict[fx.Node, list[fx.Node]] = defaultdict(list)
    last_barrier: fx.Node | None = None
    last_random: fx.Node | None = None
    since_barrier: list[fx.Node] = []
    for node in graph.nodes:
        if node.op not in CALL_OPS:
            continue
        if last_barrier is not None:
            deps[node].append(last_barrier)
        if is_barrier(node):
            deps[node].extend(since_barrier)
            last_barrier, since_barrier = node, []
        else:
            since_barrier.append(node)
        if is_random(node):
            if last_random is not None:
                deps[node].append(last_random)
            last_random = node
    return {node: tuple(preds) for node, preds in deps.items()}


def assign_depths(
    graph: fx.Graph,
    reasons: dict[fx.Node, str | None],
    order_deps: dict[fx.Node, tuple[fx.Node, ...]],
) -> dict[fx.Node, int]:
    """The depth of every placeholder, get_attr and call node (see the module docstring)."""
    depths: dict[fx.Node, int] = {}
    for node in graph.nodes:
        if node.op == "output":
            continue
        if node.op not in CALL_OPS:
            depths[node] = 0
            continue
        preds = (*node.all_input_nodes, *order_deps.get(node, ()))
        for pred in preds:
            if pred not in depths:
                raise ValueError(
                    f"partition: node {node.name!r} uses {pred.name!r} before it is defined; "
                    "the input graph must be in topological order (check gm.graph.lint())"
                )
        if reasons[node] is None:
            depths[node] = max(
                (depths[p] if reasons.get(p, "") is None else depths[p] + 1 for p in preds),
                default=1,
            )
        else:
            depths[node] = max((depths[p] for p in preds), default=0)
    return depths
