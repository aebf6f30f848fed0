"""Naming and normalising operators: packets to overloads, targets to readable names."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket

log = logging.getLogger(__name__)

OpLike = OpOverload | OpOverloadPacket


def expand_ops(ops: OpLike | Iterable[OpLike]) -> frozenset[OpOverload]:
    """Return the OpOverloads named by ``ops``.

    ``ops`` is one OpOverload / OpOverloadPacket or an iterable of them (a DecompTable
    or any mapping iterates over its keys, so it works too). A packet stands for all of
    its overloads.
    """
    if isinstance(ops, (OpOverload, OpOverloadPacket)):
        ops = (ops,)
    try:
        items = list(ops)
    except TypeError:
        raise TypeError(
            f"expected an OpOverload, an OpOverloadPacket or an iterable of them, got {ops!r}"
        ) from None
    result: set[OpOverload] = set()
    for item in items:
        if isinstance(item, OpOverload):
            result.add(item)
        elif isinstance(item, OpOverloadPacket):
            result.update(packet_overloads(item))
        else:
            raise TypeError(
                f"{item!r} is not an OpOverload or OpOverloadPacket; "
                "name ops like torch.ops.aten.add.Tensor or torch.ops.aten.add"
            )
    return frozenset(result)


def packet_overloads(packet: OpOverloadPacket) -> list[OpOverload]:
    """All overloads of ``packet`` known to the dispatcher."""
    return [getattr(packet, name) for name in packet.overloads()]


def aten_overloads(names: Iterable[str]) -> frozenset[OpOverload]:
    """Resolve ``"add.Tensor"``-style names in the aten namespace.

    Names missing from the running torch are skipped (logged at debug level), so one list
    serves several torch versions.
    """
    result = set()
    for name in names:
        packet_name, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, packet_name, None)
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if isinstance(op, OpOverload):
            result.add(op)
        else:
            log.debug("aten.%s is not in this torch (%s); skipped", name, torch.__version__)
    return frozenset(result)


def target_name(target: object) -> str:
    """A readable, stable name for an FX call_function target."""
    if isinstance(target, (OpOverload, OpOverloadPacket)):
        return str(target)
    if isinstance(target, HigherOrderOperator):
        return f"higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
    module = {"_operator": "operator", "builtins": ""}.get(module, module)
    return f"{module}.{name}" if module else name
