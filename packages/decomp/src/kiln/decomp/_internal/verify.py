"""verify(): the output contract of decompose()."""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.fx as fx
from torch._ops import HigherOrderOperator, OpOverload

from .node_kinds import is_symbolic_scalar_op
from .ops import target_name
from .opset_check import source_line

log = logging.getLogger(__name__)


class VerifyError(ValueError):
    """A graph breaks decomp's output contract; the message names the node."""


def verify(gm: fx.GraphModule) -> None:
    """Check that ``gm`` is a well-formed ATen graph as ``decompose`` produces.

    * the graph lints (``fx.Graph.lint``);
    * every call_function target is an OpOverload, ``operator.getitem``, symbolic-size
      arithmetic, or a higher-order op (torch.ops.higher_order.*);
    * every placeholder and every tensor-producing node has ``meta["val"]``, and a
      tensor output's val is a tensor.

    Raises ``VerifyError`` naming the first offending node and its source line.
    """
    try:
        gm.graph.lint()
    except Exception as err:  # lint raises bare RuntimeError/AssertionError
        raise VerifyError(f"graph does not lint: {err}") from err
    for node in gm.graph.nodes:
        problem = _target_problem(node) or _meta_problem(node, gm)
        if problem:
            raise VerifyError(f"node {node.name!r} ({source_line(node)}): {problem}")


def _target_problem(node: fx.Node) -> str | None:
    if node.op in ("call_module", "call_method"):
        return (
            f"{node.op} {node.target!r} in an ATen graph; decompose() retraces to "
            "call_function nodes, run it on this graph"
        )
    if node.op != "call_function":
        return None
    target = node.target
    if isinstance(target, (OpOverload, HigherOrderOperator)) or target is operator.getitem:
        return None
    if is_symbolic_scalar_op(node):
        return None
    return (
        f"calls {target_name(target)}, which is not an OpOverload, getitem or "
        "symbolic-size op; trace the graph to ATen (make_fx / decompose) first"
    )


def _meta_problem(node: fx.Node, gm: fx.GraphModule) -> str | None:
    if node.op in ("output", "call_module", "call_method"):
        return None
    has_val = "val" in node.meta
    if node.op == "placeholder":
        return None if has_val else "placeholder has no meta['val']"
    if not _produces_tensor(node, gm):
        return None
    if not has_val:
        return f"{_describe(node)} produces a tensor but has no meta['val']"
    if _single_tensor_output(node) and not isinstance(node.meta["val"], torch.Tensor):
        return f"meta['val'] is {type(node.meta['val']).__name__}, expected a tensor"
    return None


def _describe(node: fx.Node) -> str:
    return target_name(node.target) if node.op == "call_function" else node.op


def _produces_tensor(node: fx.Node, gm: fx.GraphModule) -> bool:
    if node.op == "get_attr":
        return isinstance(_maybe_attr(gm, node.target), torch.Tensor)
    target = node.target
    if isinstance(target, OpOverload):
        return any(_is_tensor_type(r.type) for r in target._schema.returns)
    if target is operator.getitem:
        source_val = getattr(node.args[0], "meta", {}).get("val")
        return isinstance(source_val, (list, tuple)) and any(
            isinstance(v, torch.Tensor) for v in source_val
        )
    return False


def _single_tensor_output(node: fx.Node) -> bool:
    target = node.target
    if isinstance(target, OpOverload):
        returns = target._schema.returns
        return len(returns) == 1 and isinstance(returns[0].type, torch.TensorType)
    return False


def _is_tensor_type(ty: Any) -> bool:
    """Tensor, Tensor?, Tensor[] and the like (JIT schema types)."""
    if isinstance(ty, torch.TensorType):
        return True
    return any(_is_tensor_type(t) for t in ty.containedTypes())


def _maybe_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for atom in target.split("."):
        obj = getattr(obj, atom, None)
    return obj
