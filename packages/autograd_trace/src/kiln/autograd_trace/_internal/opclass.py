"""Which call_function targets belong in a functional ATen graph, and which are pure."""

from __future__ import annotations

import logging
import math
import operator

import torch
import torch.fx

log = logging.getLogger(__name__)


def _symbolic_arithmetic() -> frozenset[object]:
    """Python callables that ``make_fx`` records for SymInt/SymFloat/SymBool arithmetic."""
    names = (
        "add sub mul truediv floordiv mod pow neg pos abs eq ne lt le gt ge "
        "and_ or_ xor not_ invert lshift rshift"
    )
    targets: set[object] = {getattr(operator, name) for name in names.split()}
    targets |= {math.floor, math.ceil, math.trunc, round, abs}
    for name in (
        "sym_float",
        "sym_int",
        "sym_max",
        "sym_min",
        "sym_not",
        "sym_ite",
        "sym_sum",
        "_sym_sqrt",
    ):
        if hasattr(torch, name):
            targets.add(getattr(torch, name))
    try:
        from torch.fx.experimental.sym_node import magic_methods, method_to_operator

        targets |= {method_to_operator(name) for name in magic_methods}
    except (ImportError, KeyError, AttributeError):  # layout differs across torch versions
        log.debug("torch.fx.experimental.sym_node has no method_to_operator table")
    return frozenset(targets)


SYMBOLIC_ARITHMETIC = _symbolic_arithmetic()


def is_op_overload(target: object) -> bool:
    return isinstance(target, torch._ops.OpOverload)


def is_allowed_target(target: object) -> bool:
    """An OpOverload, ``operator.getitem`` or symbolic size arithmetic."""
    return is_op_overload(target) or target is operator.getitem or target in SYMBOLIC_ARITHMETIC


def is_mutating(op: torch._ops.OpOverload) -> bool:
    """The op writes into one of its arguments (in-place or ``out=`` variant)."""
    return op._schema.is_mutable


def hides_mutation(node: torch.fx.Node) -> bool:
    """``aten.native_batch_norm`` in training mode updates running stats its schema omits."""
    if node.target is not torch.ops.aten.native_batch_norm.default:
        return False
    args = list(node.args) + [None] * 8
    training = node.kwargs.get("training", args[5])
    running_mean = node.kwargs.get("running_mean", args[3])
    return bool(training) and running_mean is not None


def returns_tensor(op: torch._ops.OpOverload) -> bool:
    """Some return of ``op`` is a tensor or a list of tensors."""
    tensor_type = torch._C.TensorType.get()
    for ret in op._schema.returns:
        kind = ret.type
        if isinstance(kind, torch._C.OptionalType):
            kind = kind.getElementType()
        if isinstance(kind, torch._C.ListType):
            kind = kind.getElementType()
            if isinstance(kind, torch._C.OptionalType):
                kind = kind.getElementType()
        if kind.isSubtypeOf(tensor_type):
            return True
    return False


def is_input_writeback(node: torch.fx.Node) -> bool:
    """``aten.copy_(input, value)`` with no users: functionalization's write-back of a mutation."""
    return (
        node.op == "call_function"
        and node.target is torch.ops.aten.copy_.default
        and isinstance(node.args[0], torch.fx.Node)
        and node.args[0].op in ("placeholder", "get_attr")
        and not node.users
    )


# torch.distributed's functional collectives: every rank issues them, used or not.
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d"})


def is_removable_if_unused(node: torch.fx.Node) -> bool:
    """Dropping the unused node changes nothing: no writes, no RNG use, no asserts, no
    collectives."""
    if node.op == "get_attr":
        return True
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem or target in SYMBOLIC_ARITHMETIC:
        return True
    if not is_op_overload(target):
        return False
    if is_mutating(target) or not target._schema.returns or target.namespace in COLLECTIVE_NAMESPACES:
        return False
    return torch.Tag.nondeterministic_seeded not in target.tags


def remove_unused_pure_nodes(graph: torch.fx.Graph) -> int:
    """Erase unused side-effect-free call_function and get_attr nodes; returns how many."""
    removed = 0
    for node in reversed(list(graph.nodes)):
        if not node.users and is_removable_if_unused(node):
            graph.erase_node(node)
            removed += 1
    return removed
