"""What a node does besides computing its value: input mutation, side effects, randomness.

These facts constrain the partitioner independently of any capability predicate:
a node that mutates an input never goes in a region, side-effectful nodes keep their place
relative to every other call, and random nodes keep their order among themselves.
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload, OpOverloadPacket

logger = logging.getLogger(__name__)

CALL_OPS = frozenset({"call_function", "call_method", "call_module"})

# Python-level operators that write into their first argument when it is a tensor.
_PYTHON_MUTATORS = frozenset(
    {
        operator.setitem,
        operator.delitem,
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.imatmul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.iand,
        operator.ior,
        operator.ixor,
        operator.ilshift,
        operator.irshift,
    }
)
_MUTATING_DUNDERS = frozenset(
    {"__setitem__", "__delitem__"}
    | {f"__i{n}__" for n in ("add", "sub", "mul", "truediv", "and", "or")}
)


def schema_mutates(schema: torch.FunctionSchema) -> bool:
    """True when some argument of `schema` is a mutable alias (`Tensor(a!)`)."""
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _is_inplace_name(name: str) -> bool:
    # PyTorch's naming convention: `add_`, `relu_`, `copy_` write into their first argument.
    return name.endswith("_") and not name.startswith("__")


def _function_mutates(target: Any, kwargs: dict[str, Any]) -> bool:
    if isinstance(target, OpOverload):
        return schema_mutates(target._schema)
    if isinstance(target, OpOverloadPacket):
        # The overload is chosen at run time: say "mutates" only when every overload does.
        overloads = [getattr(target, name) for name in target.overloads()]
        return bool(overloads) and all(schema_mutates(o._schema) for o in overloads)
    if "out" in kwargs or kwargs.get("inplace") is True:
        return True
    try:
        if target in _PYTHON_MUTATORS:
            return True
    except TypeError:  # unhashable callable
        pass
    return _is_inplace_name(getattr(target, "__name__", ""))


def mutates_input(node: fx.Node) -> bool:
    """True when `node` writes into one of its inputs (`copy_`, `add_`, `out=`, `x[i] = v`, ...).

    ATen ops are judged by their schema; Python callables, methods and modules by PyTorch's
    conventions (trailing underscore, `out=`, `inplace=True`, in-place operators).
    """
    if node.op == "call_function":
        return _function_mutates(node.target, node.kwargs)
    if node.op == "call_method":
        name = str(node.target)
        return _is_inplace_name(name) or name in _MUTATING_DUNDERS or "out" in node.kwargs
    if node.op == "call_module":
        module = _submodule(node)
        return module is not None and getattr(module, "inplace", False) is True
    return False


def _submodule(node: fx.Node) -> torch.nn.Module | None:
    owner = node.graph.owning_module
    if owner is None:
        return None
    try:
        return owner.get_submodule(str(node.target))
    except AttributeError:
        return None


def _is_impure(node: fx.Node, impure_random: bool) -> bool:
    try:
        return node.is_impure(impure_random=impure_random)
    except TypeError:  # torch without the impure_random argument
        return node.is_impure() and not impure_random
    except (AssertionError, AttributeError, RuntimeError):
        # Cannot tell (e.g. a call_module whose module is missing): be conservative.
        logger.debug("cannot decide purity of %s; treating it as side-effectful", node.name)
        return True


def is_random(node: fx.Node) -> bool:
    """True for call nodes that draw from the random number generator."""
    if node.op not in CALL_OPS:
        return False
    target = node.target
    if isinstance(target, OpOverload) and torch.Tag.nondeterministic_seeded in target.tags:
        return True
    return _is_impure(node, impure_random=True) and not _is_impure(node, impure_random=False)


def is_barrier(node: fx.Node) -> bool:
    """True for call nodes that must keep their position relative to every other call node:
    input mutations and side effects (asserts, profiler ranges, ...)."""
    if node.op not in CALL_OPS:
        return False
    if isinstance(node.target, OpOverload) and not node.target._schema.returns:
        return True  # an op that returns nothing runs for its effect (e.g. aten._assert_async)
    return mutates_input(node) or _is_impure(node, impure_random=False)


def op_name(node: fx.Node) -> str:
    """A readable name for what `node` calls, e.g. "aten.cumsum.default", "operator.getitem",
    "method:add", "module:Linear"."""
    target = node.target
    if node.op == "call_method":
        return f"method:{target}"
    if node.op == "call_module":
        module = _submodule(node)
        return f"module:{type(module).__name__ if module is not None else target}"
    if node.op != "call_function":
        return node.op
    if isinstance(target, (OpOverload, OpOverloadPacket)):
        return str(target)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        return repr(target)
    module = getattr(target, "__module__", None) or ""
    module = {"_operator": "operator", "builtins": ""}.get(module, module)
    if name.startswith("_VariableFunctionsClass."):
        name, module = name.removeprefix("_VariableFunctionsClass."), "torch"
    return f"{module}.{name}" if module else name
