"""What a node calls, made comparable across spellings: op keys and normalized arguments.

Two nodes can only match when their op keys are equal. The key is the target for
call_function, the method name for call_method and the module type for call_module, except
for the reshape family: `view`, `reshape` and `_unsafe_view` (ATen, prims, Torch functions
and methods) share one key, because tracing records `x.reshape(s)` as any of them
depending on strides. Their arguments normalize to `(input, shape)`.

ATen arguments are normalized through the op's schema (positional, keyword and default
values in schema order), so `aten.sum.dim_IntList(x, [1])` equals
`aten.sum.dim_IntList(x, [1], False)`. Python functions (`F.softmax`, `F.dropout`, ...) are
normalized through their signature the same way: `symbolic_trace` records every keyword
(`softmax(x, dim=-1, _stacklevel=3, dtype=None)`), Dynamo only those given. Builtins without
a signature (`torch.matmul`, `torch._C._nn.linear`) are compared as written.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Hashable
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload

logger = logging.getLogger(__name__)

RESHAPE_KEY = ("reshape-family",)
GET_ATTR_KEY = ("get_attr",)

# Aliasing kinds of the reshape family: "view" always aliases its input, "reshape" may copy,
# "fresh" (_unsafe_view) never shares storage with anything visible to the program.
_ATEN = torch.ops.aten
RESHAPE_FUNCTIONS: dict[Any, str] = {
    _ATEN.view.default: "view",
    _ATEN.reshape.default: "reshape",
    _ATEN._unsafe_view.default: "fresh",
    torch.reshape: "reshape",
    torch.Tensor.reshape: "reshape",
    torch.Tensor.view: "view",
}
if hasattr(torch.ops, "prims") and hasattr(torch.ops.prims, "reshape"):
    RESHAPE_FUNCTIONS[torch.ops.prims.reshape.default] = "fresh"  # prims.reshape copies
RESHAPE_METHODS = {"view": "view", "reshape": "reshape"}

_MISSING = object()


def reshape_kind(node: fx.Node) -> str | None:
    """"view", "reshape" or "fresh" for a node of the reshape family, else None."""
    if node.op == "call_function":
        try:
            kind = RESHAPE_FUNCTIONS.get(node.target)
        except TypeError:  # unhashable target
            return None
    elif node.op == "call_method":
        kind = RESHAPE_METHODS.get(str(node.target))
    else:
        return None
    if kind == "view" and _is_dtype_view(node):
        return None  # x.view(torch.float16) reinterprets bits; it is not a reshape
    return kind


def _is_dtype_view(node: fx.Node) -> bool:
    args = node.args[1:]
    return len(args) == 1 and isinstance(args[0], torch.dtype) or "dtype" in node.kwargs


def op_key(node: fx.Node) -> Hashable:
    """The key two nodes must share to match (see the module docstring)."""
    op = node.op
    if op in ("placeholder", "output"):
        return (op,)
    if op == "get_attr":
        return GET_ATTR_KEY
    if reshape_kind(node) is not None:
        return RESHAPE_KEY
    if op == "call_module":
        return (op, type(_submodule(node)))
    target = node.target
    try:
        hash(target)
    except TypeError:
        return (op, id(target))
    return (op, target)


def _submodule(node: fx.Node) -> torch.nn.Module | None:
    owner = node.graph.owning_module
    if owner is None:
        return None
    try:
        return owner.get_submodule(str(node.target))
    except AttributeError:
        return None


def normalized_args(node: fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) in a canonical form: see the module docstring."""
    if reshape_kind(node) is not None:
        return _reshape_args(node), {}
    target = node.target
    if node.op == "call_function" and isinstance(target, OpOverload):
        values = _schema_values(target, node.args, node.kwargs)
        if values is not None:
            return values, {}
    elif node.op == "call_function":
        values = _signature_values(target, node.args, node.kwargs)
        if values is not None:
            return values, {}
    return tuple(node.args), dict(node.kwargs)


def _reshape_args(node: fx.Node) -> tuple[Any, ...]:
    args = node.args
    source = args[0] if args else node.kwargs.get("self", node.kwargs.get("input"))
    rest = args[1:]
    if len(rest) == 1 and isinstance(rest[0], (list, tuple)):
        shape = tuple(rest[0])
    elif rest:
        shape = tuple(rest)
    else:
        found = next((node.kwargs[k] for k in ("shape", "size") if k in node.kwargs), ())
        shape = tuple(found) if isinstance(found, (list, tuple)) else (found,)
    return (source, shape)


def _schema_values(
    op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...] | None:
    arguments = op._schema.arguments
    if len(args) > len(arguments) or any(k not in _names(op) for k in kwargs):
        return None  # not what the schema says: compare as written
    values = []
    for index, argument in enumerate(arguments):
        if index < len(args):
            values.append(args[index])
        elif argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            values.append(_MISSING)
    return tuple(values)


_NAMES: dict[OpOverload, frozenset[str]] = {}


def _names(op: OpOverload) -> frozenset[str]:
    names = _NAMES.get(op)
    if names is None:
        names = _NAMES[op] = frozenset(a.name for a in op._schema.arguments)
    return names


_SIGNATURES: dict[Any, inspect.Signature | None] = {}


def _signature_values(
    target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...] | None:
    signature = _signature(target)
    if signature is None:
        return None
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None  # not a call the signature accepts: compare as written
    bound.apply_defaults()
    return tuple(bound.arguments.values())


def _signature(target: Any) -> inspect.Signature | None:
    try:
        if target in _SIGNATURES:
            return _SIGNATURES[target]
    except TypeError:  # unhashable target
        return None
    signature = None
    if inspect.isfunction(target):  # plain Python functions only: builtins have none
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            signature = None
    _SIGNATURES[target] = signature
    return signature
