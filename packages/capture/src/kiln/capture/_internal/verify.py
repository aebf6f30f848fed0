"""``verify``: the output contract of kiln.capture, checked on one graph."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from kiln.capture._internal.graph import CapturedGraph, op_name
from kiln.capture._internal.meta import VALUE_KEYS, node_value

log = logging.getLogger(__name__)

_CALL_OPS = ("call_function", "call_method", "call_module")


class VerificationError(ValueError):
    """A captured graph breaks kiln.capture's contract; the message names the node."""


def verify(
    graph: CapturedGraph | torch.fx.GraphModule, example_inputs: Sequence[Any] | None = None
) -> None:
    """Check a captured graph; raise ``VerificationError`` naming the first offending node.

    Checks: the graph lints; it has one placeholder per example input (inputs come from the
    ``CapturedGraph`` when not given); every placeholder and every call node whose result
    is used carries a fake value in ``meta["example_value"]`` or ``meta["val"]``; and a
    placeholder fed a tensor has a tensor fake value of the same rank and dtype.
    Reads no tensor data.
    """
    if isinstance(graph, CapturedGraph):
        gm = graph.gm
        example_inputs = graph.example_inputs if example_inputs is None else example_inputs
    else:
        gm = graph
    _check_lint(gm)
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    if example_inputs is not None:
        _check_input_count(placeholders, example_inputs)
    for position, node in enumerate(placeholders):
        example = example_inputs[position] if example_inputs is not None else None
        _check_placeholder(node, example)
    for node in gm.graph.nodes:
        if node.op in _CALL_OPS and node.users and not node_value(node.meta)[0]:
            raise VerificationError(
                f"node {node.name!r} ({op_name(node)}) has no fake value in "
                f"{' or '.join(f'meta[{k!r}]' for k in VALUE_KEYS)}; Dynamo and torch.export "
                "set one on every node, so a pass that created or replaced this node must "
                "copy it over"
            )
    log.debug("verified graph with %d placeholders", len(placeholders))


def _check_lint(gm: torch.fx.GraphModule) -> None:
    try:
        gm.graph.lint()
    except Exception as error:  # lint raises RuntimeError or AssertionError, by check
        raise VerificationError(f"graph does not lint: {error}") from error


def _check_input_count(placeholders: list[torch.fx.Node], example_inputs: Sequence[Any]) -> None:
    if len(placeholders) != len(example_inputs):
        names = ", ".join(node.name for node in placeholders)
        raise VerificationError(
            f"graph has {len(placeholders)} placeholders ({names}) but "
            f"{len(example_inputs)} example inputs; they must match one to one"
        )


def _check_placeholder(node: torch.fx.Node, example: Any) -> None:
    found, value = node_value(node.meta)
    if not found:
        raise VerificationError(
            f"placeholder {node.name!r} has no fake value in meta['example_value'] or "
            "meta['val']; record it when building the graph"
        )
    if not isinstance(example, torch.Tensor):
        return
    if not isinstance(value, torch.Tensor):
        raise VerificationError(
            f"placeholder {node.name!r} is fed a tensor but its fake value is "
            f"{type(value).__name__}"
        )
    if value.dim() != example.dim() or value.dtype != example.dtype:
        raise VerificationError(
            f"placeholder {node.name!r}: fake value is {value.dtype} of rank {value.dim()}, "
            f"example input is {example.dtype} of rank {example.dim()}"
        )
