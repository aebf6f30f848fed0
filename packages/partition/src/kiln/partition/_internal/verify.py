"""`verify`: check the output contract of `partition`."""

from __future__ import annotations

import logging
import operator

import torch.fx as fx
from torch._ops import OpOverload

from .effects import CALL_OPS, mutates_input, op_name
from .meta import REGION_PREFIX, has_value

logger = logging.getLogger(__name__)


class PartitionVerificationError(ValueError):
    """A partitioned graph breaks the contract of `kiln.partition.partition`."""

    __module__ = "kiln.partition"


def verify(gm: fx.GraphModule) -> None:
    """Check a GraphModule returned by `partition`; raise `PartitionVerificationError`
    naming the offending node.

    Checks: the graph is in topological order and lints; every `kiln_region_*` call targets
    a GraphModule that lints, whose placeholders and value-producing call nodes carry
    meta["val"] (or Dynamo's meta["example_value"]), that mutates none of its inputs, returns a tuple, and is unpacked only by
    in-range getitems.
    """
    if not isinstance(gm, fx.GraphModule):
        raise PartitionVerificationError(
            f"expected a torch.fx.GraphModule, got {type(gm).__name__}"
        )
    _check_graph(gm.graph, "partitioned graph")
    for node in gm.graph.nodes:
        if node.op == "call_module" and str(node.target).startswith(REGION_PREFIX):
            _check_region(gm, node)


def _check_graph(graph: fx.Graph, where: str) -> None:
    seen: set[fx.Node] = set()
    for node in graph.nodes:
        for source in node.all_input_nodes:
            if source not in seen:
                raise PartitionVerificationError(
                    f"{where}: node {node.name!r} uses {source.name!r} before it is defined "
                    "(not in topological order)"
                )
        seen.add(node)
    try:
        graph.lint()
    except Exception as error:
        raise PartitionVerificationError(f"{where}: graph.lint() failed: {error}") from error


def _check_region(gm: fx.GraphModule, call: fx.Node) -> None:
    name = str(call.target)
    module = getattr(gm, name, None)
    if not isinstance(module, fx.GraphModule):
        raise PartitionVerificationError(
            f"node {call.name!r} calls {name!r}, which is {type(module).__name__}, not a GraphModule"
        )
    where = f"region {name}"
    _check_graph(module.graph, where)
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(call.args) or call.kwargs:
        raise PartitionVerificationError(
            f"node {call.name!r} passes {len(call.args)} args (+{len(call.kwargs)} kwargs) to "
            f"{name}, which has {len(placeholders)} placeholders"
        )
    for node in module.graph.nodes:
        if node.op in CALL_OPS and mutates_input(node):
            raise PartitionVerificationError(
                f"{where}: node {node.name!r} ({op_name(node)}) mutates an input inside a region"
            )
        if _needs_val(node) and not has_value(node):
            raise PartitionVerificationError(
                f"{where}: node {node.name!r} ({node.format_node()}) has no meta['val']; "
                "propagate values (e.g. trace with make_fx or FakeTensorProp) before partitioning"
            )
    _check_unpacking(call, module, where)


def _needs_val(node: fx.Node) -> bool:
    if isinstance(node.target, OpOverload) and not node.target._schema.returns:
        return False  # e.g. aten._assert_async: produces nothing
    return node.op == "placeholder" or node.op in CALL_OPS


def _check_unpacking(call: fx.Node, module: fx.GraphModule, where: str) -> None:
    output = next(n for n in reversed(module.graph.nodes) if n.op == "output")
    results = output.args[0]
    if not isinstance(results, tuple):
        raise PartitionVerificationError(
            f"{where}: output returns {type(results).__name__}, expected a tuple"
        )
    for user in call.users:
        index = user.args[1] if len(user.args) == 2 else None
        if (
            user.target is not operator.getitem
            or not isinstance(index, int)
            or not 0 <= index < len(results)
        ):
            raise PartitionVerificationError(
                f"{where}: its result is used by {user.name!r} ({user.format_node()}); only "
                f"operator.getitem with an index in [0, {len(results)}) may use it"
            )
