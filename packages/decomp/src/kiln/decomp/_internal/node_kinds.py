"""What kind of computation an FX node is: a tensor op, or structure around tensor ops.

"Structural" nodes are not ops of an opset: ``operator.getitem`` on multi-output ops,
``aten.sym_size`` / ``sym_stride`` / ``sym_numel`` / ``sym_storage_offset``, and the
Python arithmetic on symbolic sizes that dynamic-shape tracing records
(``operator.mul`` on SymInts, ``torch.sym_max``, ...), and input write-backs: the
``aten.copy_(placeholder, new_value)`` that a functionalized graph ends with when it mutates
an input (BatchNorm running stats, ``x.add_(1)`` on an argument), the graph's calling
convention for input mutation rather than a computation.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._ops import HigherOrderOperator, OpOverload

from .ops import packet_overloads

SYM_SIZE_OPS = frozenset(
    op
    for name in ("sym_size", "sym_stride", "sym_numel", "sym_storage_offset")
    if hasattr(torch.ops.aten, name)
    for op in packet_overloads(getattr(torch.ops.aten, name))
)

_SCALAR_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)
_SYMBOLIC_MODULES = ("_operator", "operator", "math", "builtins", "torch")


def is_symbolic_scalar_op(node: fx.Node) -> bool:
    """A call of Python arithmetic / torch.sym_* on sizes (meta val is a scalar)."""
    target = node.target
    if node.op != "call_function" or isinstance(target, (OpOverload, HigherOrderOperator)):
        return False
    if not isinstance(node.meta.get("val"), _SCALAR_TYPES):
        return False
    module = getattr(target, "__module__", None) or ""
    return module in _SYMBOLIC_MODULES or module.startswith("torch.fx.experimental")


def is_input_write_back(node: fx.Node) -> bool:
    """``aten.copy_`` into a placeholder (or an ``aten.alias`` of one): functionalization's
    write-back of a mutated input."""
    if node.op != "call_function" or node.target is not torch.ops.aten.copy_.default:
        return False
    target = node.args[0]
    while isinstance(target, fx.Node) and target.target is torch.ops.aten.alias.default:
        target = target.args[0]
    return isinstance(target, fx.Node) and target.op == "placeholder"


def is_structural(node: fx.Node) -> bool:
    """getitem, sym_size-style queries, symbolic-size arithmetic, input write-backs."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem or node.target in SYM_SIZE_OPS:
        return True
    return is_symbolic_scalar_op(node) or is_input_write_back(node)
