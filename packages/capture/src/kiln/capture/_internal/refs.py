"""Callables and operators named in a saved graph: encode by name, resolve by name.

An FX node's target is an ATen operator (``aten.add.Tensor``), a higher-order operator
(``torch.ops.higher_order.cond``), or a Python callable (``torch.sin``, ``operator.mul``,
``torch.nn.functional.linear``). Each is stored as a name and resolved again on load. A
callable is saved only if its name resolves back to the very same object, so a graph that
saves also loads. Loading imports only modules under ``torch``, ``operator``, ``math`` and
``builtins`` unless the caller trusts more: a saved graph cannot make ``load`` import
arbitrary code.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable
from typing import Any

import torch

log = logging.getLogger(__name__)

DEFAULT_TRUSTED_MODULES = ("torch", "operator", "_operator", "math", "builtins")


class RefError(ValueError):
    """A target that cannot be named, or a saved name that cannot be resolved."""


def encode_ref(obj: Any) -> dict[str, Any]:
    """A tagged dict naming an operator, higher-order operator, callable or class."""
    if isinstance(obj, torch._ops.OpOverload):
        return {"$": "op", "name": str(obj), "schema": str(obj._schema)}
    if isinstance(obj, torch._ops.OpOverloadPacket):
        return {"$": "op_packet", "name": str(obj)}
    if isinstance(obj, torch._ops.HigherOrderOperator):
        return {"$": "hop", "name": obj.name()}
    module, qualname = _importable_name(obj)
    return {"$": "ref", "module": module, "qualname": qualname}


def is_ref(data: Any) -> bool:
    return isinstance(data, dict) and data.get("$") in ("op", "op_packet", "hop", "ref")


def ref_text(data: dict[str, Any]) -> str:
    """The readable name of an encoded reference: ``aten.add.Tensor``, ``torch.sin``."""
    if data["$"] == "ref":
        return f"{data['module']}.{data['qualname']}"
    if data["$"] == "hop":
        return f"torch.ops.higher_order.{data['name']}"
    return str(data["name"])


class RefResolver:
    """Resolves encoded references; imports only modules under the trusted roots."""

    def __init__(self, trusted_modules: Iterable[str] = ()) -> None:
        self.trusted = tuple(DEFAULT_TRUSTED_MODULES) + tuple(trusted_modules)

    def resolve(self, data: dict[str, Any]) -> Any:
        """The object an encoded reference names; raises ``RefError`` saying what to do."""
        kind = data["$"]
        if kind == "op":
            return self._op_overload(data)
        if kind == "op_packet":
            return _torch_op(*str(data["name"]).split("."))
        if kind == "hop":
            return _higher_order_op(str(data["name"]))
        return self._callable(str(data["module"]), str(data["qualname"]))

    def resolve_or_text(self, data: dict[str, Any]) -> Any:
        """Like ``resolve``, but an unresolvable or untrusted name comes back as its text."""
        try:
            return self.resolve(data)
        except RefError:
            return ref_text(data)

    def _op_overload(self, data: dict[str, Any]) -> torch._ops.OpOverload:
        op = _torch_op(*str(data["name"]).split("."))
        saved_schema = data.get("schema")
        if saved_schema and str(op._schema) != saved_schema:
            raise RefError(
                f"operator {data['name']} changed: the file was saved with schema "
                f"'{saved_schema}', this torch {torch.__version__} has '{op._schema}'"
            )
        return op

    def _callable(self, module_name: str, qualname: str) -> Any:
        if not any(module_name == m or module_name.startswith(m + ".") for m in self.trusted):
            raise RefError(
                f"the graph calls {module_name}.{qualname}, and load imports only modules "
                f"under {', '.join(self.trusted)}; pass trusted_modules=({module_name!r},) "
                "if you trust this file"
            )
        try:
            return _lookup(importlib.import_module(module_name), qualname)
        except (ImportError, AttributeError) as error:
            raise RefError(f"cannot resolve {module_name}.{qualname}: {error}") from error


def _importable_name(obj: Any) -> tuple[str, str]:
    """``(module, qualname)`` that resolves back to ``obj``; raises ``RefError`` otherwise."""
    objclass = getattr(obj, "__objclass__", None)
    candidates = []
    module = getattr(obj, "__module__", None)
    if module is None and objclass is not None:
        module = objclass.__module__
    if isinstance(module, str):
        module = "operator" if module == "_operator" else module
        for name in (getattr(obj, "__qualname__", None), getattr(obj, "__name__", None)):
            if isinstance(name, str) and (module, name) not in candidates:
                candidates.append((module, name))
    for module_name, name in candidates:
        try:
            if _lookup(importlib.import_module(module_name), name) is obj:
                return module_name, name
        except (ImportError, AttributeError):
            continue
    raise RefError(
        f"{obj!r} cannot be saved by name: no importable module attribute is this object "
        "(a lambda, a closure or a bound method?)"
    )


def _lookup(root: Any, dotted: str) -> Any:
    value = root
    for part in dotted.split("."):
        if part == "<locals>":
            raise AttributeError(f"{dotted} is local to a function")
        value = getattr(value, part)
    return value


def _torch_op(*parts: str) -> Any:
    try:
        return _lookup(torch.ops, ".".join(parts))
    except (AttributeError, RuntimeError) as error:
        raise RefError(
            f"operator {'.'.join(parts)} is not registered in this torch {torch.__version__}; "
            "if it is a custom op, import the library that defines it before load"
        ) from error


def _higher_order_op(name: str) -> Any:
    try:
        return getattr(torch.ops.higher_order, name)
    except AttributeError as error:
        raise RefError(
            f"higher-order operator {name} does not exist in torch {torch.__version__}"
        ) from error
