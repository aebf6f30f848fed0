"""Capability predicates: which call nodes a backend claims.

A predicate is a `Supported` object: a callable `node -> bool` with a readable description,
composable with `&`, `|` and `~`. The helpers build the usual ones from op sets, dtypes and
device types; any `Callable[[fx.Node], bool]` can be wrapped with `Supported(fn, "why")`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload, OpOverloadPacket

from .meta import has_value, node_value

logger = logging.getLogger(__name__)

NodePredicate = Callable[[fx.Node], bool]


@dataclass(frozen=True, slots=True)
class Supported:
    """A node predicate with a description; `a & b`, `a | b` and `~a` build new ones.

    `fn` receives call_function / call_method / call_module nodes and returns whether the
    backend can run them. Plain callables are accepted on either side of `&` and `|`.
    """

    fn: NodePredicate
    description: str = "custom predicate"

    def __call__(self, node: fx.Node) -> bool:
        return bool(self.fn(node))

    def __and__(self, other: NodePredicate) -> Supported:
        other = as_supported(other)
        return Supported(_Both(self, other), f"({self.description} & {other.description})")

    def __rand__(self, other: NodePredicate) -> Supported:
        return as_supported(other) & self

    def __or__(self, other: NodePredicate) -> Supported:
        other = as_supported(other)
        return Supported(_Either(self, other), f"({self.description} | {other.description})")

    def __ror__(self, other: NodePredicate) -> Supported:
        return as_supported(other) | self

    def __invert__(self) -> Supported:
        return Supported(_Negated(self), f"~{self.description}")

    def __repr__(self) -> str:
        return f"Supported({self.description})"

    __str__ = __repr__


def as_supported(predicate: NodePredicate) -> Supported:
    """`predicate` itself when it is a `Supported`, else a `Supported` wrapping it."""
    if isinstance(predicate, Supported):
        return predicate
    if not callable(predicate):
        raise TypeError(f"a node predicate must be callable (node -> bool), got {predicate!r}")
    name = getattr(predicate, "__name__", None) or repr(predicate)
    return Supported(predicate, name)


@dataclass(frozen=True, slots=True)
class _Both:
    left: Supported
    right: Supported

    def __call__(self, node: fx.Node) -> bool:
        return self.left(node) and self.right(node)


@dataclass(frozen=True, slots=True)
class _Either:
    left: Supported
    right: Supported

    def __call__(self, node: fx.Node) -> bool:
        return self.left(node) or self.right(node)


@dataclass(frozen=True, slots=True)
class _Negated:
    inner: Supported

    def __call__(self, node: fx.Node) -> bool:
        return not self.inner(node)


@dataclass(frozen=True, slots=True)
class _OpSet:
    functions: frozenset[Any]
    packets: frozenset[OpOverloadPacket]
    method_names: frozenset[str]
    module_types: tuple[type[torch.nn.Module], ...]

    def __call__(self, node: fx.Node) -> bool:
        target = node.target
        if node.op == "call_method":
            return target in self.method_names
        if node.op == "call_module":
            owner = node.graph.owning_module
            if owner is None or not self.module_types:
                return False
            return isinstance(owner.get_submodule(str(target)), self.module_types)
        if node.op != "call_function":
            return False
        if isinstance(target, OpOverload) and target.overloadpacket in self.packets:
            return True
        try:
            return target in self.functions or target in self.packets
        except TypeError:  # unhashable target
            return False


def supports_ops(ops: Iterable[object]) -> Supported:
    """Supported when the node calls one of `ops`.

    `ops` may hold OpOverloads (`aten.add.Tensor`), OpOverloadPackets (`aten.add`: every
    overload), any other callable matched by identity (`torch.relu`, `operator.getitem`),
    strings (method names for call_method nodes: `"add"`), and `nn.Module` subclasses
    (call_module nodes whose module is an instance).
    """
    functions, packets, names, module_types = set(), set(), set(), []
    for op in ops:
        if isinstance(op, OpOverloadPacket):
            packets.add(op)
        elif isinstance(op, str):
            names.add(op)
        elif isinstance(op, type) and issubclass(op, torch.nn.Module):
            module_types.append(op)
        elif callable(op):
            try:
                functions.add(op)
            except TypeError:
                raise TypeError(f"supports_ops: op {op!r} is not hashable") from None
        else:
            raise TypeError(
                f"supports_ops: {op!r} is not an op; pass OpOverloads, OpOverloadPackets, "
                "callables, method names (str) or nn.Module subclasses"
            )
    matcher = _OpSet(
        frozenset(functions), frozenset(packets), frozenset(names), tuple(module_types)
    )
    shown = sorted(str(o) for o in [*packets, *functions, *names, *module_types])
    more = f", ... +{len(shown) - 4}" if len(shown) > 4 else ""
    return Supported(matcher, f"ops{{{', '.join(shown[:4])}{more}}}")


def tensors_in(value: object) -> Iterator[torch.Tensor]:
    """The tensors in a node's "val": itself, or those in (nested) tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


@dataclass(frozen=True, slots=True)
class _TensorsAll:
    field: str
    allowed: frozenset[Any]

    def __call__(self, node: fx.Node) -> bool:
        if not has_value(node):
            return False
        for tensor in tensors_in(node_value(node)):
            value = tensor.dtype if self.field == "dtype" else tensor.device.type
            if value not in self.allowed:
                return False
        return True


def supports_dtypes(dtypes: Iterable[torch.dtype]) -> Supported:
    """Supported when every tensor in node.meta["val"] (or "example_value") has one of
    `dtypes`.

    A node without "val" is not supported; a node whose value holds no tensor (a SymInt,
    None) is.
    """
    allowed = frozenset(dtypes)
    for dtype in allowed:
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"supports_dtypes: {dtype!r} is not a torch.dtype")
    names = ", ".join(sorted(str(d).removeprefix("torch.") for d in allowed))
    return Supported(_TensorsAll("dtype", allowed), f"dtypes{{{names}}}")


def supports_devices(types: Iterable[str | torch.device]) -> Supported:
    """Supported when every tensor in node.meta["val"] lives on a device of one of `types`
    ("cpu", "cuda", or torch.device objects; the index is ignored)."""
    allowed = frozenset(torch.device(t).type for t in types)
    return Supported(_TensorsAll("device", allowed), f"devices{{{', '.join(sorted(allowed))}}}")


@dataclass(frozen=True, slots=True)
class _HasTag:
    tags: frozenset[torch.Tag]

    def __call__(self, node: fx.Node) -> bool:
        target = node.target
        return (
            node.op == "call_function"
            and isinstance(target, OpOverload)
            and any(tag in self.tags for tag in target.tags)
        )


def supports_tags(tags: Iterable[torch.Tag]) -> Supported:
    """Supported when the node calls an ATen/prims OpOverload carrying one of `tags`
    (e.g. `{torch.Tag.pointwise}`); Torch IR nodes are never supported by it."""
    wanted = frozenset(tags)
    for tag in wanted:
        if not isinstance(tag, torch.Tag):
            raise TypeError(f"supports_tags: {tag!r} is not a torch.Tag")
    names = ", ".join(sorted(t.name for t in wanted))
    return Supported(_HasTag(wanted), f"tags{{{names}}}")
