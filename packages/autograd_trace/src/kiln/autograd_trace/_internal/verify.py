"""``verify``: the output contract of kiln.autograd_trace, checked node by node."""

from __future__ import annotations

import logging
import operator

import torch
import torch.fx

from .errors import VerifyError
from .lifting import fetch_attr
from .meta import VAL, describe_node, user_source_line
from .opclass import (
    hides_mutation,
    is_allowed_target,
    is_input_writeback,
    is_mutating,
    is_op_overload,
    returns_tensor,
)

log = logging.getLogger(__name__)


def verify(gm: torch.fx.GraphModule) -> None:
    """Check that ``gm`` is a functional ATen graph as ``trace_inference`` promises.

    - every call_function target is an ``OpOverload`` (ATen, prims or a ``torch.library``
      custom op), ``operator.getitem`` or SymInt arithmetic; no call_method / call_module;
    - no op writes into its arguments, except ``aten.copy_`` write-backs into a placeholder or
      get_attr that come after all other computation;
    - every tensor-producing node (placeholders, tensor get_attrs, ops returning tensors)
      carries ``meta["val"]``.

    Raises ``VerifyError`` naming the first offending node; returns None.
    """
    try:
        gm.graph.lint()
    except Exception as error:
        raise VerifyError(f"kiln.autograd_trace.verify: graph fails lint: {error}") from error
    in_writebacks = False
    for node in gm.graph.nodes:
        if node.op in ("call_method", "call_module"):
            _fail(node, f"{node.op} nodes are not allowed in a functional ATen graph")
        if node.op == "call_function":
            _check_target(node)
            in_writebacks = _check_mutation(node, in_writebacks)
        _check_val(gm, node)


def _check_target(node: torch.fx.Node) -> None:
    if isinstance(node.target, torch._ops.OpOverloadPacket):
        _fail(node, "the target is an OpOverloadPacket; pick an overload, e.g. aten.add.Tensor")
    if not is_allowed_target(node.target):
        _fail(node, "the target is not an ATen OpOverload, operator.getitem or SymInt arithmetic")


def _check_mutation(node: torch.fx.Node, in_writebacks: bool) -> bool:
    """Returns whether the trailing run of input write-backs has started."""
    if is_input_writeback(node):
        return True
    if is_op_overload(node.target) and is_mutating(node.target):
        _fail(node, "the op mutates an argument (in-place or out=); functionalize the graph")
    if hides_mutation(node):
        _fail(
            node,
            "aten.native_batch_norm in training mode updates running_mean/running_var in "
            "place (its schema does not say so); trace F.batch_norm to "
            "_native_batch_norm_legit_functional instead",
        )
    if in_writebacks and not _is_size_bookkeeping(node):
        _fail(node, "computation after the input write-backs (aten.copy_ into inputs)")
    return in_writebacks


def _is_size_bookkeeping(node: torch.fx.Node) -> bool:
    if is_op_overload(node.target):
        return node.target.overloadpacket is torch.ops.aten.sym_size
    return True


def _check_val(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    if node.op == "placeholder":
        needs_val = True
    elif node.op == "get_attr":
        needs_val = isinstance(fetch_attr(gm, node.target), torch.Tensor)
    elif node.op == "call_function" and is_op_overload(node.target):
        needs_val = returns_tensor(node.target)
    elif node.op == "call_function" and node.target is operator.getitem:
        source = node.args[0]
        needs_val = isinstance(source, torch.fx.Node) and _holds_tensors(source.meta.get(VAL))
    else:
        needs_val = False
    if needs_val and node.meta.get(VAL) is None:
        _fail(
            node,
            'the node produces a value but has no meta["val"]; trace it with make_fx '
            "or fill the meta with FakeTensor propagation",
        )


def _holds_tensors(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value)


def _fail(node: torch.fx.Node, reason: str) -> None:
    message = f"kiln.autograd_trace.verify: {describe_node(node)}: {reason}"
    source = user_source_line(node)
    if source:
        message += "\n  user code: " + source.replace("\n", "\n  ")
    raise VerifyError(message)
