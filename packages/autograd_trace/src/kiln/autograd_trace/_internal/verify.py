"""``verify``: the output contract of kiln.autograd_trace, checked node by node."""

from __future__ import annotations

import logging
import operator

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .errors import VerifyError
from .joint import JointGraph
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
from .partitioner import Partition

log = logging.getLogger(__name__)


def verify(graph: torch.fx.GraphModule | JointGraph | Partition) -> None:
    """Check a graph (or a ``JointGraph`` / ``Partition``) against this package's contract.

    A ``GraphModule`` is checked as ``trace_inference`` output (below). A ``JointGraph``: its
    graph has no write-backs at all, as many placeholders as primals plus tangents, as many
    outputs as forward outputs plus grads, tangents shaped like their forward outputs and grads
    like their primals. A ``Partition``: both graphs are functional with no write-backs, the
    forward returns forward outputs, saved tensors and saved sizes, and the backward takes the
    saved values first, in the same order.

    Raises ``VerifyError`` naming the first offending node; returns None.
    """
    if isinstance(graph, JointGraph):
        _verify_joint(graph)
    elif isinstance(graph, Partition):
        _verify_partition(graph)
    else:
        _verify_graph(graph, allow_writebacks=True)


def _verify_graph(gm: torch.fx.GraphModule, *, allow_writebacks: bool) -> None:
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
            if not allow_writebacks and is_input_writeback(node):
                _fail(
                    node,
                    "joint, forward and backward graphs write no inputs: the runtime applies mutations",
                )
            in_writebacks = _check_mutation(node, in_writebacks)
        _check_val(gm, node)


def _verify_joint(joint: JointGraph) -> None:
    _verify_graph(joint.gm, allow_writebacks=False)
    placeholders = joint.primals + joint.tangents
    output = joint.gm.graph.output_node()
    expected = joint.num_primals + len(joint.tangent_outputs)
    if len(placeholders) != expected:
        _fail(output, f"{len(placeholders)} placeholders, expected {expected} primals and tangents")
    if len(output.args[0]) != joint.num_forward_outputs + len(joint.grad_inputs):
        _fail(
            output,
            "the outputs are not the forward outputs followed by one grad per grad_inputs entry",
        )
    forward = joint.forward_output_nodes
    for tangent, j in zip(joint.tangents, joint.tangent_outputs, strict=True):
        _check_same_shape(tangent, forward[j], "tangent", "its forward output")
    for grad, i in zip(joint.grad_nodes, joint.grad_inputs, strict=True):
        _check_same_shape(grad, joint.primals[i], "gradient", f"primal {joint.primals[i].name!r}")


def _verify_partition(partition: Partition) -> None:
    for gm in (partition.fw_gm, partition.bw_gm):
        _verify_graph(gm, allow_writebacks=False)
    output = partition.fw_gm.graph.output_node()
    expected = partition.num_forward_outputs + len(partition.saved)
    if len(output.args[0]) != expected:
        _fail(output, f"the forward returns {len(output.args[0])} values, expected {expected}")
    bw_inputs = [n.name for n in partition.bw_gm.graph.nodes if n.op == "placeholder"]
    saved_names = [s.name for s in partition.saved]
    if bw_inputs[: len(saved_names)] != saved_names:
        _fail(
            partition.bw_gm.graph.output_node(),
            f"the backward's first inputs {bw_inputs[: len(saved_names)]} are not the saved values {saved_names}",
        )


def _check_same_shape(node: object, other: object, what: str, other_what: str) -> None:
    if not isinstance(node, torch.fx.Node) or not isinstance(other, torch.fx.Node):
        return
    value, reference = node.meta.get(VAL), other.meta.get(VAL)
    if isinstance(value, torch.Tensor) and isinstance(reference, torch.Tensor):
        if len(value.shape) != len(reference.shape) or any(
            statically_known_true(a != b) for a, b in zip(value.shape, reference.shape)
        ):
            _fail(
                node,
                f"{what} of shape {list(value.shape)} differs from {other_what} {list(reference.shape)}",
            )


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
