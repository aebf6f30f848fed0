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
precedes every later call; random ops follow the previous random op; collectives follow the
previous collective (and never go in a region).

Why a region is not part of an earlier one is recorded while depths are assigned: the
unsupported node that raised its depth, and whether the region also reads the earlier one
directly (then merging them would have made a cycle through that unsupported node).
"""

from __future__ import annotations

import logging
import operator
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from .effects import CALL_OPS, Effects, effects_of
from .meta import node_value
from .predicates import Supported

logger = logging.getLogger(__name__)

NOT_SUPPORTED = "not supported by predicate"
MUTATES_INPUT = "mutates an input"
COLLECTIVE = "collective (runs on the communicator, in graph order)"
SPLIT_UNSUPPORTED = "unsupported node"
SPLIT_CYCLE = "cycle avoidance"
SPLIT_MIN_SIZE = "min_size"


@dataclass(frozen=True, slots=True)
class SplitCause:
    """Why group `later` is not part of group `earlier` (indices into `RegionPlan.groups`).

    `earlier` is None when the chain leading to `via` starts at graph inputs. `edge` is the
    pair (producer, user) of a direct read between the two groups, for cycle avoidance.
    """

    later: int
    earlier: int | None
    reason: str
    via: fx.Node
    edge: tuple[fx.Node, fx.Node] | None = None


@dataclass(frozen=True, slots=True)
class RegionPlan:
    """The outcome of planning, before any graph is built."""

    regions: tuple[tuple[fx.Node, ...], ...]  # kept regions, each in original order
    dissolved: tuple[tuple[fx.Node, ...], ...]  # regions smaller than min_size
    unsupported: tuple[tuple[fx.Node, str], ...]  # (node, reason), in original order
    order_deps: dict[fx.Node, tuple[fx.Node, ...]]  # extra predecessors from side effects
    groups: tuple[tuple[fx.Node, ...], ...] = ()  # every group, kept or not, by depth
    splits: tuple[SplitCause, ...] = ()


def plan_regions(graph: fx.Graph, supported: Supported, min_size: int) -> RegionPlan:
    """Classify, order and group the call nodes of `graph` into regions."""
    cache: dict[Any, Effects] = {}
    effects = {n: effects_of(n, cache) for n in graph.nodes if n.op in CALL_OPS}
    reasons = classify(graph, supported, effects)
    order_deps = ordering_deps(graph, effects)
    depths, causes = assign_depths(graph, reasons, order_deps)
    by_depth: dict[int, list[fx.Node]] = defaultdict(list)
    for node, reason in reasons.items():
        if reason is None:
            by_depth[depths[node]].append(node)
    groups = tuple(tuple(by_depth[d]) for d in sorted(by_depth))
    kept = tuple(g for g in groups if len(g) >= min_size)
    dissolved = tuple(g for g in groups if len(g) < min_size)
    unsupported = tuple((n, r) for n, r in reasons.items() if r is not None)
    splits = explain_splits(groups, depths, causes, reasons, order_deps)
    logger.debug(
        "planned %d regions (%d dissolved by min_size=%d), %d unsupported nodes",
        len(kept),
        len(dissolved),
        min_size,
        len(unsupported),
    )
    return RegionPlan(kept, dissolved, unsupported, order_deps, groups, splits)


def classify(
    graph: fx.Graph, supported: Supported, effects: dict[fx.Node, Effects]
) -> dict[fx.Node, str | None]:
    """Call node -> None when it may go in a region, else the reason it may not."""
    reasons: dict[fx.Node, str | None] = {}
    for node in graph.nodes:
        if node.op not in CALL_OPS:
            continue
        producer = _multi_output_producer(node)
        if effects[node].mutates:
            reasons[node] = MUTATES_INPUT
        elif effects[node].collective:
            reasons[node] = COLLECTIVE
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
    return source if isinstance(node_value(source), (tuple, list)) else None


def _ask(supported: Supported, node: fx.Node) -> bool:
    try:
        return supported(node)
    except Exception as error:
        raise RuntimeError(
            f"partition: predicate {supported!r} raised on node {node.name!r} "
            f"({node.format_node()}): {error}"
        ) from error


def ordering_deps(
    graph: fx.Graph, effects: dict[fx.Node, Effects]
) -> dict[fx.Node, tuple[fx.Node, ...]]:
    """Extra predecessors that keep side effects in place (linear in the number of nodes)."""
    deps: dict[fx.Node, list[fx.Node]] = defaultdict(list)
    last_barrier: fx.Node | None = None
    last_random: fx.Node | None = None
    last_collective: fx.Node | None = None
    since_barrier: list[fx.Node] = []
    for node, effect in effects.items():
        if last_barrier is not None:
            deps[node].append(last_barrier)
        if effect.barrier:
            deps[node].extend(since_barrier)
            last_barrier, since_barrier = node, []
        else:
            since_barrier.append(node)
        if effect.random:
            if last_random is not None:
                deps[node].append(last_random)
            last_random = node
        if effect.collective:
            if last_collective is not None:
                deps[node].append(last_collective)
            last_collective = node
    return {node: tuple(preds) for node, preds in deps.items()}


def assign_depths(
    graph: fx.Graph,
    reasons: dict[fx.Node, str | None],
    order_deps: dict[fx.Node, tuple[fx.Node, ...]],
) -> tuple[dict[fx.Node, int], dict[fx.Node, fx.Node]]:
    """The depth of every placeholder, get_attr and call node (see the module docstring),
    and for each call node the input that set its depth (its "cause")."""
    depths: dict[fx.Node, int] = {}
    causes: dict[fx.Node, fx.Node] = {}
    for node in graph.nodes:
        if node.op == "output":
            continue
        if node.op not in CALL_OPS:
            depths[node] = 0
            continue
        best, cause = (1, None) if reasons[node] is None else (0, None)
        step = 0 if reasons[node] is not None else 1
        for pred in (*node.all_input_nodes, *order_deps.get(node, ())):
            depth = depths.get(pred)
            if depth is None:
                raise ValueError(
                    f"partition: node {node.name!r} uses {pred.name!r} before it is defined; "
                    "the input graph must be in topological order (check gm.graph.lint())"
                )
            if step and reasons.get(pred, "") is not None:
                depth += 1
            if depth > best or (cause is None and depth == best):
                best, cause = depth, pred
        depths[node] = best
        if cause is not None:
            causes[node] = cause
    return depths, causes


def explain_splits(
    groups: tuple[tuple[fx.Node, ...], ...],
    depths: dict[fx.Node, int],
    causes: dict[fx.Node, fx.Node],
    reasons: dict[fx.Node, str | None],
    order_deps: dict[fx.Node, tuple[fx.Node, ...]],
) -> tuple[SplitCause, ...]:
    """For every group after the first depth, why it is not part of an earlier group."""
    group_of = {node: index for index, group in enumerate(groups) for node in group}
    splits = []
    for index, group in enumerate(groups):
        depth = depths[group[0]]
        raised = next(
            (n for n in group if n in causes and reasons.get(causes[n], "") is not None), None
        )
        if raised is None:
            continue  # depth 1: reads only graph inputs and constants, starts nothing new
        via = causes[raised]
        if via.op not in CALL_OPS:
            continue
        earlier = _source_group(via, causes, reasons, group_of)
        edge = _direct_read(group, depth, depths, group_of, order_deps)
        if edge is not None:
            earlier = group_of[edge[0]]
            splits.append(SplitCause(index, earlier, SPLIT_CYCLE, via, edge))
        else:
            splits.append(SplitCause(index, earlier, SPLIT_UNSUPPORTED, via))
    return tuple(splits)


def _source_group(
    node: fx.Node,
    causes: dict[fx.Node, fx.Node],
    reasons: dict[fx.Node, str | None],
    group_of: dict[fx.Node, int],
) -> int | None:
    # Follow the chain of unsupported nodes that set each other's depth back to a group.
    while node is not None and reasons.get(node, "") is not None:
        node = causes.get(node)
    return None if node is None else group_of.get(node)


def _direct_read(
    group: tuple[fx.Node, ...],
    depth: int,
    depths: dict[fx.Node, int],
    group_of: dict[fx.Node, int],
    order_deps: dict[fx.Node, tuple[fx.Node, ...]],
) -> tuple[fx.Node, fx.Node] | None:
    """An edge from a supported node of an earlier group into `group`, if there is one."""
    for node in group:
        for pred in (*node.all_input_nodes, *order_deps.get(node, ())):
            if pred in group_of and depths[pred] < depth:
                return pred, node
    return None
