"""Counting the ops of a graph and checking them against an allowed opset."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch.fx as fx
from torch._ops import OpOverload, OpOverloadPacket

from .node_kinds import is_structural
from .ops import target_name

log = logging.getLogger(__name__)


def opset(gm: fx.GraphModule) -> Counter[OpOverload | str]:
    """Count the call_function targets of ``gm``.

    Keys are the OpOverload itself for ATen/prims ops, and a readable name string for
    other targets (``"operator.getitem"``, ``"torch.sym_max"``, ``"higher_order.cond"``).
    """
    return Counter(_key(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _key(target: object) -> OpOverload | str:
    return target if isinstance(target, OpOverload) else target_name(target)


@dataclass(frozen=True, slots=True)
class OffendingNode:
    """A node outside the allowed opset: its name, its op and the user source line."""

    name: str
    op: str
    source: str

    def __str__(self) -> str:
        return f"{self.name}: {self.op}  [{self.source}]"


class OpsetError(ValueError):
    """Raised by ``check_opset``; ``.nodes`` lists the offending nodes."""

    def __init__(self, nodes: list[OffendingNode]) -> None:
        self.nodes = nodes
        ops = sorted({n.op for n in nodes})
        lines = [
            f"{len(nodes)} node(s) use {len(ops)} op(s) outside the allowed opset: "
            + ", ".join(ops),
            *(f"  {n}" for n in nodes),
            "Add a decomposition for these ops to the table (kiln.decomp.register), or allow them.",
        ]
        super().__init__("\n".join(lines))


def check_opset(
    gm: fx.GraphModule,
    allowed: Iterable[OpOverload | OpOverloadPacket | str],
    *,
    ignore_structural: bool = True,
) -> None:
    """Raise ``OpsetError`` naming every call_function node whose op is not in ``allowed``.

    ``allowed`` holds OpOverloads, packets (all their overloads) and name strings as
    ``opset`` spells them. With ``ignore_structural`` (default), ``getitem``,
    ``sym_size``-style queries, symbolic-size arithmetic and input write-backs
    (``aten.copy_`` into a placeholder, how a functional graph mutates an input) are
    always allowed.
    """
    allowed_ops, allowed_names = _normalise_allowed(allowed)
    offending = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or (ignore_structural and is_structural(node)):
            continue
        if node.target in allowed_ops or target_name(node.target) in allowed_names:
            continue
        offending.append(OffendingNode(node.name, target_name(node.target), source_line(node)))
    if offending:
        raise OpsetError(offending)


def _normalise_allowed(
    allowed: Iterable[OpOverload | OpOverloadPacket | str],
) -> tuple[set[OpOverload], set[str]]:
    ops: set[OpOverload] = set()
    names: set[str] = set()
    for item in allowed:
        if isinstance(item, OpOverload):
            ops.add(item)
        elif isinstance(item, OpOverloadPacket):
            ops.update(getattr(item, o) for o in item.overloads())
        elif isinstance(item, str):
            names.add(item)
        else:
            raise TypeError(f"allowed ops must be OpOverloads, packets or names, got {item!r}")
    return ops, names


def source_line(node: fx.Node) -> str:
    """The innermost user frame of ``node.meta["stack_trace"]``, or ``"no stack trace"``."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return "no stack trace"
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    frames = [i for i, line in enumerate(lines) if line.startswith("File ")]
    if not frames:
        return lines[-1]
    last = frames[-1]
    code = lines[last + 1] if last + 1 < len(lines) else ""
    return f"{lines[last]}: {code}" if code else lines[last]
