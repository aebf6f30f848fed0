"""Graphs whose inputs include a list: compiled autograd's calling convention.

Dynamo hands a compiled-autograd backward graph over as ``(inputs: list[Tensor], *sym_sizes)``:
one placeholder holds every gradient, activation and parameter as a list, and the graph reads
its items with ``operator.getitem``. kiln's stages take flat inputs, so the list placeholder is
replaced by one placeholder per item and the compiled module flattens its arguments the same
way at run time. A list placeholder marked ``steal_arg`` (the caller hands its list over) is
cleared once flattened, so the tensors it held are freed as soon as the graph is done with
them, as they are under Inductor.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx


def has_list_inputs(example_inputs: Sequence[Any]) -> bool:
    return any(isinstance(v, (list, tuple)) for v in example_inputs)


def flatten_list_inputs(gm: fx.GraphModule, example_inputs: Sequence[Any]
                        ) -> tuple[fx.GraphModule, list[Any], tuple[int, ...], tuple[int, ...]]:
    """Rewrite ``gm`` so each list input becomes one placeholder per item.

    Returns the rewritten graph module, the flat example inputs, the positions of the list
    inputs and those of the lists to clear after flattening. Raises ``NotImplementedError``
    naming the node when a list input is used other than by indexing it with a constant.
    """
    gm = _copy(gm)  # Dynamo reads its own graph's placeholders after the backend returns
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise ValueError(f"kiln: the graph has {len(placeholders)} inputs but {len(example_inputs)} "
                         "example inputs were given")
    flat_examples: list[Any] = []
    list_positions, steal_positions = [], []
    for position, (node, example) in enumerate(zip(placeholders, example_inputs, strict=True)):
        if not isinstance(example, (list, tuple)):
            flat_examples.append(example)
            continue
        list_positions.append(position)
        if node.meta.get("steal_arg", False) and isinstance(example, list):
            steal_positions.append(position)
        _split_placeholder(gm.graph, node, example)
        flat_examples.extend(example)
    gm.graph.lint()
    gm.recompile()
    return gm, flat_examples, tuple(list_positions), tuple(steal_positions)


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    graph = fx.Graph()
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    return fx.GraphModule(gm, graph)


def _split_placeholder(graph: fx.Graph, node: fx.Node, example: Sequence[Any]) -> None:
    with graph.inserting_before(node):
        items = []
        for i, value in enumerate(example):
            item = graph.placeholder(f"{node.name}_{i}")
            item.meta["val"] = value
            if isinstance(value, torch.Tensor):
                item.meta["example_value"] = value
            items.append(item)
    for user in list(node.users):
        index = user.args[1] if user.target is operator.getitem and len(user.args) == 2 else None
        if user.op != "call_function" or not isinstance(index, int):
            raise NotImplementedError(
                f"kiln: list input {node.name!r} is used by {user.format_node()}; only indexing it "
                "with a constant (inputs[i]) is supported")
        user.replace_all_uses_with(items[index])
        graph.erase_node(user)
    graph.erase_node(node)


class FlatInputs(torch.nn.Module):
    """Calls ``compiled`` with the list arguments at ``list_positions`` spliced in flat."""

    def __init__(self, compiled: torch.nn.Module, list_positions: tuple[int, ...],
                 steal_positions: tuple[int, ...]) -> None:
        super().__init__()
        self.compiled = compiled
        self.list_positions = frozenset(list_positions)
        self.steal_positions = steal_positions

    def forward(self, *args: Any) -> Any:
        flat: list[Any] = []
        for position, value in enumerate(args):
            if position in self.list_positions:
                flat.extend(value)
            else:
                flat.append(value)
        for position in self.steal_positions:
            args[position].clear()
        return self.compiled(*flat)
