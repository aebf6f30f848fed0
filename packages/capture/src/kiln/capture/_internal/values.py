"""The values found in FX graphs (node arguments, ``node.meta``) as JSON data, and back.

JSON ``null``, booleans, numbers, strings and lists stand for themselves; everything else
is a dict tagged by its ``"$"`` key: ``tuple``, ``dict`` (any keys), ``node`` (a reference
to an earlier node by name), ``dtype``, ``device``, ``torch`` (``torch.contiguous_format``
and other torch enum values), ``slice``, ``range``, ``ellipsis``, ``complex``, ``size``,
``tensor`` (real data, stored beside the JSON under a key), ``fake`` (tensor metadata),
``symint``/``symfloat``/``symbool``, and the references of ``refs.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from kiln.capture._internal.fake_values import (
    FakeValueBuilder,
    SymbolTable,
    describe_tensor,
    is_fake,
    storage_key,
)
from kiln.capture._internal.refs import RefError, RefResolver, encode_ref, is_ref

log = logging.getLogger(__name__)

_TORCH_ENUM_TYPES = (torch.memory_format, torch.layout, torch.qscheme)


class UnsavableValue(TypeError):
    """A value of a kind that a graph file cannot hold."""


class ValueEncoder:
    """Encodes the values of one file; real tensors and symbols are collected on the side."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.symbols = SymbolTable()
        self._tensor_keys: dict[int, str] = {}
        self._storage_groups: dict[int, int] = {}

    def tensor_key(self, tensor: torch.Tensor, prefix: str = "t") -> str:
        """The key under which a real tensor is stored; one key per tensor object."""
        key = self._tensor_keys.get(id(tensor))
        if key is None:
            key = f"{prefix}{len(self.tensors)}"
            self._tensor_keys[id(tensor)] = key
            self.tensors[key] = tensor
        return key

    def encode(self, value: Any) -> Any:
        """JSON data for ``value``; raises ``UnsavableValue`` naming the unsupported type."""
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, torch.fx.Node):
            return {"$": "node", "name": value.name}
        if isinstance(value, torch.Size):
            return {"$": "size", "items": [self.encode(v) for v in value]}
        if isinstance(value, tuple):
            return {"$": "tuple", "items": [self.encode(v) for v in value]}
        if isinstance(value, list):
            return [self.encode(v) for v in value]
        if isinstance(value, dict):
            return {
                "$": "dict",
                "items": [[self.encode(k), self.encode(v)] for k, v in value.items()],
            }
        if isinstance(value, torch.Tensor):
            return self._encode_tensor(value)
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.symbols.encode_sym(value)
        simple = _encode_simple(value)
        if simple is not None:
            return simple
        try:
            return encode_ref(value)
        except RefError as error:
            raise UnsavableValue(f"{type(value).__name__} value {value!r}: {error}") from error

    def _encode_tensor(self, tensor: torch.Tensor) -> dict[str, Any]:
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) and not is_fake(tensor):
            raise UnsavableValue(f"tensor subclass {type(tensor).__name__} is not supported")
        if not is_fake(tensor):
            return {"$": "tensor", "key": self.tensor_key(tensor)}
        key = storage_key(tensor)
        group = None
        if key is not None:
            group = self._storage_groups.setdefault(key, len(self._storage_groups))
        return describe_tensor(tensor, self.symbols, group)


def _encode_simple(value: Any) -> dict[str, Any] | None:
    if isinstance(value, torch.dtype):
        return {"$": "dtype", "name": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"$": "device", "name": str(value)}
    if isinstance(value, _TORCH_ENUM_TYPES):
        return {"$": "torch", "name": str(value).removeprefix("torch.")}
    if isinstance(value, slice):
        return {"$": "slice", "args": [_plain(value.start), _plain(value.stop), _plain(value.step)]}
    if isinstance(value, range):
        return {"$": "range", "args": [value.start, value.stop, value.step]}
    if value is Ellipsis:
        return {"$": "ellipsis"}
    if isinstance(value, complex):
        return {"$": "complex", "re": value.real, "im": value.imag}
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"$": "node", "name": value.name}
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise UnsavableValue(f"slice bound {value!r} of type {type(value).__name__}")


class ValueDecoder:
    """Decodes the JSON data of one file; fake values are rebuilt by ``fakes``."""

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor],
        fakes: FakeValueBuilder,
        resolver: RefResolver,
    ) -> None:
        self.tensors = tensors
        self.fakes = fakes
        self.resolver = resolver

    def decode(self, data: Any, nodes: Mapping[str, torch.fx.Node], *, strict: bool) -> Any:
        """The value ``data`` encodes. ``strict`` references must resolve (targets, arguments);
        others (``node.meta``) may come back as their text."""
        if data is None or isinstance(data, (bool, int, float, str)):
            return data
        if isinstance(data, list):
            return [self.decode(v, nodes, strict=strict) for v in data]
        tag = data.get("$")
        if tag in _CONTAINERS:
            return _CONTAINERS[tag]([self.decode(v, nodes, strict=strict) for v in data["items"]])
        if tag == "dict":
            pairs = (
                (self.decode(k, nodes, strict=strict), self.decode(v, nodes, strict=strict))
                for k, v in data["items"]
            )
            return dict(pairs)
        if tag == "node":
            return nodes[data["name"]]
        if tag == "slice":
            return slice(*(self.decode(v, nodes, strict=strict) for v in data["args"]))
        if is_ref(data):
            return self.resolver.resolve(data) if strict else self.resolver.resolve_or_text(data)
        decoder = self._decoders().get(tag)
        if decoder is None:
            raise ValueError(f"unknown value tag {tag!r} in the graph file")
        return decoder(data)

    def _decoders(self) -> dict[str, Callable[[dict], Any]]:
        return {
            "tensor": lambda d: self.tensors[d["key"]],
            "fake": self.fakes.tensor,
            "symint": self.fakes.sym,
            "symfloat": self.fakes.sym,
            "symbool": self.fakes.sym,
            "dtype": lambda d: _torch_attr(d["name"], torch.dtype),
            "device": lambda d: torch.device(d["name"]),
            "torch": lambda d: _torch_attr(d["name"], _TORCH_ENUM_TYPES),
            "range": lambda d: range(*d["args"]),
            "ellipsis": lambda d: Ellipsis,
            "complex": lambda d: complex(d["re"], d["im"]),
        }


_CONTAINERS: dict[str, Callable[[list], Any]] = {"tuple": tuple, "size": torch.Size}


def _torch_attr(name: str, kind: type | tuple[type, ...]) -> Any:
    value = getattr(torch, name, None)
    if not isinstance(value, kind):
        raise ValueError(f"torch.{name} is not a {kind} in torch {torch.__version__}")
    return value
