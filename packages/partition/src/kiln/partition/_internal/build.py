"""Building the partitioned GraphModule from a `RegionPlan`.

Regions and the remaining nodes are scheduled by Kahn's algorithm on the condensed graph
(data edges plus the side-effect ordering edges), ties broken by original position, so the
result is deterministic and stays close to the original order. Each region becomes a plain
`fx.GraphModule` called through `call_module`; it always returns a tuple, which the parent
unpacks with `operator.getitem` nodes named after the values they stand for.
"""

from __future__ import annotations

import copy
import functools
import heapq
import itertools
import logging
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from .meta import PLACEHOLDER_META_KEYS, REGION_PREFIX, VAL
from .regions import RegionPlan

logger = logging.getLogger(__name__)

try:  # Generates code on first use, not at construction (torch >= 2.2; private API)
    from torch.fx._lazy_graph_module import _LazyGraphModule as _GraphModuleClass
except ImportError:  # pragma: no cover - older or future torch without it
    _GraphModuleClass = fx.GraphModule


@dataclass(frozen=True, slots=True)
class BuiltRegion:
    """A region as emitted: its submodule name, nodes, and interface (original nodes)."""

    name: str
    nodes: tuple[fx.Node, ...]
    inputs: tuple[fx.Node, ...]
    outputs: tuple[fx.Node, ...]


@dataclass(frozen=True, slots=True)
class _Unit:
    position: int  # original position of the first node: the Kahn tie-breaker
    nodes: tuple[fx.Node, ...]
    is_region: bool


def build_partitioned(
    gm: fx.GraphModule, plan: RegionPlan
) -> tuple[fx.GraphModule, list[BuiltRegion]]:
    """A new GraphModule with each region of `plan` outlined into a submodule."""
    graph = gm.graph
    new_graph = _empty_graph_like(graph)
    env: dict[fx.Node, fx.Node] = {}
    attributes: dict[str, Any] = {}
    built: list[BuiltRegion] = []
    names = _region_names(gm)
    for node in graph.nodes:
        if node.op == "placeholder":
            env[node] = new_graph.node_copy(node, env.__getitem__)
    for unit in schedule(graph, plan):
        if not unit.is_region:
            (node,) = unit.nodes
            env[node] = new_graph.node_copy(node, env.__getitem__)
            if node.op in ("get_attr", "call_module"):
                attributes[node.target] = fetch_attr(gm, node)
            continue
        region = _emit_region(gm, new_graph, env, unit.nodes, next(names))
        attributes[region.info.name] = region.module
        built.append(region.info)
    new_graph.node_copy(_output(graph), env.__getitem__)
    new_gm = _GraphModuleClass(attributes, new_graph)
    new_gm.train(gm.training)
    new_gm.meta.update(getattr(gm, "meta", {}))
    return new_gm, built


def _output(graph: fx.Graph) -> fx.Node:
    return next(n for n in reversed(graph.nodes) if n.op == "output")


def _empty_graph_like(graph: fx.Graph) -> fx.Graph:
    new_graph = fx.Graph(
        tracer_cls=getattr(graph, "_tracer_cls", None),
        tracer_extras=getattr(graph, "_tracer_extras", None),
    )
    codegen = getattr(graph, "_codegen", None)  # pytree in/out specs of exported graphs
    if codegen is not None:
        new_graph.set_codegen(codegen)  # stateless apart from the specs: safe to share
    return new_graph


def _region_names(gm: fx.GraphModule) -> Iterator[str]:
    # Skip names already taken, e.g. when partitioning an already partitioned graph.
    for index in itertools.count():
        name = f"{REGION_PREFIX}{index}"
        if not hasattr(gm, name):
            yield name


def fetch_attr(gm: fx.GraphModule, node: fx.Node) -> Any:
    """The object a get_attr / call_module node refers to."""
    try:
        return functools.reduce(getattr, str(node.target).split("."), gm)
    except AttributeError:
        raise ValueError(
            f"partition: node {node.name!r} refers to attribute {node.target!r}, which the "
            "GraphModule does not have"
        ) from None


def schedule(graph: fx.Graph, plan: RegionPlan) -> list[_Unit]:
    """Regions and the remaining non-placeholder nodes in a topological order."""
    units, unit_of = _make_units(graph, plan)
    preds: list[set[int]] = [set() for _ in units]
    succs: list[list[int]] = [[] for _ in units]
    for index, unit in enumerate(units):
        for node in unit.nodes:
            for pred in (*node.all_input_nodes, *plan.order_deps.get(node, ())):
                source = unit_of.get(pred)
                if source is not None and source != index and source not in preds[index]:
                    preds[index].add(source)
                    succs[source].append(index)
    waiting = [len(p) for p in preds]
    ready = [(unit.position, i) for i, unit in enumerate(units) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[_Unit] = []
    while ready:
        _, index = heapq.heappop(ready)
        order.append(units[index])
        for succ in succs[index]:
            waiting[succ] -= 1
            if waiting[succ] == 0:
                heapq.heappush(ready, (units[succ].position, succ))
    if len(order) != len(units):  # cannot happen for depth-built regions; guard the invariant
        stuck = next(u for i, u in enumerate(units) if waiting[i] > 0)
        raise AssertionError(f"partition: cycle among regions around node {stuck.nodes[0].name!r}")
    return order


def _make_units(graph: fx.Graph, plan: RegionPlan) -> tuple[list[_Unit], dict[fx.Node, int]]:
    position = {node: i for i, node in enumerate(graph.nodes)}
    units: list[_Unit] = []
    unit_of: dict[fx.Node, int] = {}
    for region in plan.regions:
        for node in region:
            unit_of[node] = len(units)
        units.append(_Unit(position[region[0]], region, True))
    for node in graph.nodes:
        if node.op in ("placeholder", "output") or node in unit_of:
            continue
        if (
            node.op == "get_attr"
            and node.users
            and all(u in unit_of and units[unit_of[u]].is_region for u in node.users)
        ):
            continue  # copied into the regions that use it
        unit_of[node] = len(units)
        units.append(_Unit(position[node], (node,), False))
    return units, unit_of


@dataclass(frozen=True, slots=True)
class _Emitted:
    module: fx.GraphModule
    info: BuiltRegion


def _emit_region(
    gm: fx.GraphModule,
    parent: fx.Graph,
    env: dict[fx.Node, fx.Node],
    nodes: tuple[fx.Node, ...],
    name: str,
) -> _Emitted:
    members = set(nodes)
    inputs, attrs = region_inputs(nodes, members)
    outputs = tuple(n for n in nodes if any(user not in members for user in n.users))
    module = build_region_module(gm, nodes, inputs, attrs, outputs)
    call = parent.create_node("call_module", name, tuple(env[i] for i in inputs), {}, name=name)
    if all(VAL in o.meta for o in outputs):
        call.meta[VAL] = tuple(o.meta[VAL] for o in outputs)
    for index, produced in enumerate(outputs):
        item = parent.create_node(
            "call_function", operator.getitem, (call, index), {}, name=produced.name
        )
        item.meta = copy.copy(produced.meta)
        env[produced] = item
    logger.debug("%s: %d nodes, %d inputs, %d outputs", name, len(nodes), len(inputs), len(outputs))
    return _Emitted(module, BuiltRegion(name, nodes, inputs, outputs))


def region_inputs(
    nodes: tuple[fx.Node, ...], members: set[fx.Node]
) -> tuple[tuple[fx.Node, ...], tuple[fx.Node, ...]]:
    """(values read from outside, get_attr nodes to copy in), each in first-use order."""
    inputs: dict[fx.Node, None] = {}
    attrs: dict[fx.Node, None] = {}
    for node in nodes:
        for source in node.all_input_nodes:
            if source not in members:
                (attrs if source.op == "get_attr" else inputs)[source] = None
    return tuple(inputs), tuple(attrs)


def build_region_module(
    gm: fx.GraphModule,
    nodes: tuple[fx.Node, ...],
    inputs: tuple[fx.Node, ...],
    attrs: tuple[fx.Node, ...],
    outputs: tuple[fx.Node, ...],
) -> fx.GraphModule:
    """A plain GraphModule: placeholders for `inputs`, the region's nodes, a tuple output."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for source in inputs:
        placeholder = graph.placeholder(source.name, type_expr=source.type)
        placeholder.meta.update(
            {k: source.meta[k] for k in PLACEHOLDER_META_KEYS if k in source.meta}
        )
        env[source] = placeholder
    for node in (*attrs, *nodes):
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[o] for o in outputs))
    attributes = {
        str(n.target): fetch_attr(gm, n)
        for n in (*attrs, *nodes)
        if n.op in ("get_attr", "call_module")
    }
    return _GraphModuleClass(attributes, graph)
