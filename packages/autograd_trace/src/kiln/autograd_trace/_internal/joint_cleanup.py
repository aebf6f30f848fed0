"""Tidying the functionalized joint graph into the layout ``JointGraph`` documents."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.fx

from .analysis import ForwardAnalysis
from .errors import TraceError
from .meta import VAL
from .opclass import is_input_writeback, remove_unused_pure_nodes

log = logging.getLogger(__name__)

aten = torch.ops.aten


def clean_functional_joint(
    gm: torch.fx.GraphModule,
    analysis: ForwardAnalysis,
    *,
    primal_names: Sequence[str],
    primal_values: Sequence[object],
    num_tangents: int,
) -> tuple[int, ...]:
    """Drop write-backs, detaches and absent grads; name placeholders. Returns ``grad_inputs``.

    Edits ``gm`` in place (it was just made by the trace and is not shared).
    """
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    num_primals = len(primal_names)
    if len(placeholders) != num_primals + num_tangents:
        raise AssertionError(
            f"expected {num_primals}+{num_tangents} placeholders, found {len(placeholders)}"
        )
    new_values = _drop_input_writebacks(graph, placeholders[:num_primals], analysis, primal_names)
    _drop_detaches(graph)
    _drop_unread_running_stats(graph)
    grad_inputs = _drop_absent_grads(graph, analysis, new_values)
    remove_unused_pure_nodes(graph)
    _name_placeholders(placeholders, primal_names, primal_values)
    graph.lint()
    gm.recompile()
    return grad_inputs


def _drop_input_writebacks(
    graph: torch.fx.Graph,
    primals: Sequence[torch.fx.Node],
    analysis: ForwardAnalysis,
    names: Sequence[str],
) -> dict[torch.fx.Node, torch.fx.Node]:
    """Erase ``copy_(primal, new)`` write-backs; their new values are already forward outputs."""
    new_values: dict[torch.fx.Node, torch.fx.Node] = {}
    index_of = {node: i for i, node in enumerate(primals)}
    for node in list(graph.nodes):
        if not is_input_writeback(node) or node.args[0] not in index_of:
            continue
        primal, value = node.args[0], node.args[1]
        i = index_of[primal]
        if not analysis.inputs[i].mutated:
            raise TraceError(
                f"kiln.autograd_trace: input {names[i]!r} is written in the joint graph but the "
                "forward analysis saw no mutation (its version counter did not move); an op "
                "mutates it without declaring so in its schema"
            )
        new_values[primal] = value
        graph.erase_node(node)
    return new_values


def _drop_detaches(graph: torch.fx.Graph) -> None:
    """``detach`` is the identity in a graph that autograd never sees."""
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.detach.default:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


def _drop_unread_running_stats(graph: torch.fx.Graph) -> None:
    """A training batch norm's backward (``train=True``) never reads its running statistics
    (optional arguments): passed None, they are not saved for the backward, so the forward may
    write their new values into the module's buffers in place (runtime.INPUT_MUTATIONS)."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target is aten.native_batch_norm_backward.default \
                and len(node.args) > 7 and node.args[7] is True:
            node.args = (*node.args[:3], None, None, *node.args[5:])


def _drop_absent_grads(
    graph: torch.fx.Graph,
    analysis: ForwardAnalysis,
    new_values: dict[torch.fx.Node, torch.fx.Node],
) -> tuple[int, ...]:
    output = graph.output_node()
    values = list(output.args[0])
    num_forward = len(analysis.forward_requires_grad)
    forward = [
        new_values.get(v, v) if isinstance(v, torch.fx.Node) else v for v in values[:num_forward]
    ]
    wrt = [i for i, info in enumerate(analysis.inputs) if info.requires_grad]
    grads = values[num_forward:]
    if len(grads) != len(wrt):
        raise AssertionError(f"expected {len(wrt)} grads, found {len(grads)}")
    kept = [(i, g) for i, g in zip(wrt, grads) if g is not None]
    output.args = (tuple(forward) + tuple(g for _, g in kept),)
    return tuple(i for i, _ in kept)


def _name_placeholders(
    placeholders: Sequence[torch.fx.Node],
    primal_names: Sequence[str],
    primal_values: Sequence[object],
) -> None:
    """Primals keep the input names; plain int/float/bool primals get their value as meta."""
    names = [*primal_names, *(f"tangent_{j}" for j in range(len(placeholders) - len(primal_names)))]
    for i, (node, name) in enumerate(zip(placeholders, names, strict=True)):
        if i < len(primal_values):
            node.meta.setdefault(VAL, primal_values[i])
        rename = getattr(node, "_rename", None)
        if rename is not None:
            rename(name)
            node.target = node.name
