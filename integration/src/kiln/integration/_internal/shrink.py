"""Shrinking a diverging ATen graph to the smallest node set that still diverges (`bisect`).

A node set S of the graph's call nodes defines a sub-program: S's nodes computed as in the
graph, every value they read from outside S fed in as an input holding the value eager computed
for it, and every tensor S computes returned (so a wrong intermediate shows even where later
ops would hide it). The failing check (one pipeline stage run on the sub-program, compared with
eager's values) decides; delta debugging drops chunks of nodes, halving the chunk size, while
the sub-program still fails, down to single nodes: the result is 1-minimal (no one node of it
can go) within the step budget.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx


@dataclasses.dataclass(frozen=True)
class SubProgram:
    """A node set of a graph as a program of its own: `gm(*inputs)` computes it, and
    `expected` holds eager's values of its outputs."""

    gm: fx.GraphModule
    inputs: list[Any]
    expected: list[Any]
    nodes: tuple[str, ...]  # "name = op(args)" of each node, in graph order


def eager_values(gm: fx.GraphModule, inputs: Sequence[Any]) -> dict[fx.Node, Any]:
    """Every node's value when `gm` runs eagerly on `inputs` (tensors cloned as computed, so a
    later in-place op does not change what an earlier node produced)."""
    values: dict[fx.Node, Any] = {}

    class Recording(fx.Interpreter):
        def run_node(self, node: fx.Node) -> Any:
            result = super().run_node(node)
            values[node] = result.clone() if isinstance(result, torch.Tensor) else result
            return result

    with torch.no_grad():
        Recording(gm).run(*[v.clone() if isinstance(v, torch.Tensor) else v for v in inputs])
    return values


def describe(node: fx.Node) -> str:
    """`name = op(args)`, as a person reads a node."""
    args = [*map(str, node.args), *(f"{k}={v}" for k, v in node.kwargs.items())]
    target = node.target if isinstance(node.target, (str, torch._ops.OpOverload)) else node.target.__name__
    return f"{node.name} = {target}({', '.join(args)})"


def call_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]


def sub_program(gm: fx.GraphModule, kept: Sequence[fx.Node], values: dict[fx.Node, Any]) -> SubProgram:
    """The sub-program of the node set `kept` (nodes of `gm`, any order)."""
    kept_set = set(kept)
    # a getitem whose multi-output op is not kept reads eager's value instead (a tuple input
    # would make an invalid program)
    kept_set -= {n for n in kept_set if n.target is operator.getitem and n.args[0] not in kept_set}
    ordered = [n for n in gm.graph.nodes if n in kept_set]
    outside = []
    for node in ordered:
        for read in node.all_input_nodes:
            if read not in kept_set and read.op != "get_attr" and read not in outside:
                outside.append(read)
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for read in outside:
        env[read] = graph.placeholder(read.name)
        env[read].meta = dict(read.meta)
    for node in ordered:
        for read in node.all_input_nodes:
            if read.op == "get_attr" and read not in env:
                env[read] = graph.node_copy(read)
        env[node] = graph.node_copy(node, lambda n: env[n])
    returned = [n for n in ordered if isinstance(values.get(n), torch.Tensor)]
    graph.output(tuple(env[n] for n in returned))
    return SubProgram(fx.GraphModule(gm, graph), [values[n] for n in outside], [values[n] for n in returned],
                      tuple(describe(n) for n in ordered))


def shrink(gm: fx.GraphModule, values: dict[fx.Node, Any], fails: Callable[[SubProgram], str | None],
           max_steps: int = 64) -> tuple[SubProgram, str] | None:
    """The smallest node set of `gm` whose sub-program `fails` (returns what differs, None when
    it matches eager), with that failure; None when the whole graph's sub-program does not fail.
    At most `max_steps` checks."""
    nodes = call_nodes(gm)
    program = sub_program(gm, nodes, values)
    failure = fails(program)
    if failure is None:
        return None
    kind = failure_kind(failure)
    steps, chunk = 1, max(len(nodes) // 2, 1)
    while chunk >= 1 and steps < max_steps:
        start = 0
        while start < len(nodes) and steps < max_steps:
            candidate_nodes = nodes[:start] + nodes[start + chunk:]
            candidate = sub_program(gm, candidate_nodes, values) if candidate_nodes else None
            outcome = fails(candidate) if candidate is not None and candidate.expected else None
            steps += 1
            if outcome is not None and failure_kind(outcome) == kind:
                nodes, program, failure = candidate_nodes, candidate, outcome
            else:
                start += chunk
        chunk //= 2
    return program, failure


def failure_kind(failure: str) -> str:
    """What kind of failure a stage's outcome is: its exception type ("raised TypeError",
    "RegionMismatchError") or "output" (values differ). A smaller program failing otherwise (a
    sub-program the pipeline cannot take) is not the same bug."""
    return failure.split(":", 1)[0] if failure.startswith(("raised ", "RegionMismatchError")) else "output"
