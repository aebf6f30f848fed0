"""What a node does besides computing its value: input mutation, side effects, randomness,
communication.

These facts constrain the partitioner independently of any capability predicate:
a node that mutates an input never goes in a region, side-effectful nodes keep their place
relative to every other call, random nodes keep their order among themselves, and collectives
(``_c10d_functional.all_reduce``, ``wait_tensor``, ...) never go in a region and keep their
order among themselves: every rank must issue them in the same order, and a ``wait_tensor``
stays after its collective and before every use of its result (data edges see to that).
Compute that does not depend on a collective may still move across it.
"""

from __future__ import annotations

import logging
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket

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


# torch.distributed's functional collectives (and their autograd variants): ops that return
# new tensors, so nothing else marks them as effects, but that run on a communicator.
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d"})


def is_collective(node: fx.Node) -> bool:
    """True for calls of a collective op (all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
    wait_tensor, ...) of torch.distributed's functional collectives."""
    target = node.target
    return node.op == "call_function" and isinstance(target, (OpOverload, OpOverloadPacket)) and \
        getattr(target, "namespace", None) in COLLECTIVE_NAMESPACES


def is_barrier(node: fx.Node) -> bool:
    """True for call nodes that must keep their position relative to every other call node:
    input mutations and side effects (asserts, profiler ranges, ...)."""
    if node.op not in CALL_OPS:
        return False
    return mutates_input(node) or _is_barrier_besides_mutation(node)


def _is_barrier_besides_mutation(node: fx.Node) -> bool:
    if isinstance(node.target, OpOverload) and not node.target._schema.returns:
        return True  # an op that returns nothing runs for its effect (e.g. aten._assert_async)
    return _is_impure(node, impure_random=False)


@dataclass(frozen=True, slots=True)
class Effects:
    """What a call node does besides computing its value."""

    mutates: bool  # writes into one of its inputs
    barrier: bool  # must keep its place relative to every other call
    random: bool  # draws from the random number generator
    collective: bool = False  # communicates with other ranks: out of regions, in order


NO_EFFECTS = Effects(mutates=False, barrier=False, random=False)


def effects_of(node: fx.Node, cache: dict[Any, Effects] | None = None) -> Effects:
    """The `Effects` of `node`; `cache` (target -> Effects) makes repeated targets cheap.

    Only facts that depend on the target alone are cached: OpOverloads (schema and tags) and
    plain functions called without `out=` / `inplace=`; higher-order operators, methods and
    modules are judged node by node.
    """
    if node.op not in CALL_OPS:
        return NO_EFFECTS
    key = _cache_key(node) if cache is not None else None
    if key is not None:
        found = cache.get(key)
        if found is not None:
            return found
    mutates = mutates_input(node)
    effects = Effects(mutates, mutates or _is_barrier_besides_mutation(node), is_random(node),
                      is_collective(node))
    if key is not None:
        cache[key] = effects
    return effects


def _cache_key(node: fx.Node) -> Any:
    if node.op != "call_function" or isinstance(node.target, HigherOrderOperator):
        return None
    if not isinstance(node.target, OpOverload) and (
        "out" in node.kwargs or "inplace" in node.kwargs
    ):
        return None
    try:
        hash(node.target)
    except TypeError:
        return None
    return node.target


def cached_op_name(node: fx.Node, cache: dict[Any, str]) -> str:
    """`op_name(node)`, memoized by target for call_function nodes (str(OpOverload) is slow
    enough to show on 100,000-node graphs)."""
    if node.op != "call_function":
        return op_name(node)
    try:
        found = cache.get(node.target)
    except TypeError:
        return op_name(node)
    if found is None:
        found = cache[node.target] = op_name(node)
    return found


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
