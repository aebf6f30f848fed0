"""`Pattern`: a subgraph to look for, written as a Python function or given as an FX graph.

A function is traced to FX: with `fx.symbolic_trace` when no example inputs are given
(Torch IR: call_function / call_method / call_module), with `make_fx` when they are (ATen
IR, or a prims-like opset when a decomposition table is given). The pattern matches graphs
in the IR it was traced to. Placeholders are wildcards; literal arguments match exactly
(`literals="exact"`) or match any literal (`literals="any"`, captured in `Match.literals`).
"""

from __future__ import annotations

import logging
import math
import types
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Literal

import torch
import torch.fx as fx
from torch._ops import OpOverload
from torch.fx.experimental.proxy_tensor import make_fx

from .meta import node_value
from .opkeys import normalized_args, op_key

logger = logging.getLogger(__name__)

LiteralMode = Literal["exact", "any"]
PatternSource = Callable[..., Any] | fx.Graph | fx.GraphModule


class Pattern:
    """A pattern graph, ready to match.

    Args:
        source: a function or `nn.Module` (traced), an `fx.GraphModule` or an `fx.Graph`.
        example_inputs: when given, `source` is traced with `make_fx` (ATen IR) on them;
            when None, with `fx.symbolic_trace` (Torch IR).
        decompositions: a decomposition table for `make_fx` (e.g. to trace to prims).
        literals: "exact" (literal arguments must be equal) or "any" (they match any
            literal or symbolic scalar, recorded in `Match.literals`).
        check: an extra predicate `match -> bool` (shapes, dtypes, ...).
        name: shown in reports and recorded on replacement nodes; defaults to the
            function's name.

    Attributes: `module` (the traced GraphModule), `placeholders`, `outputs` (pattern
    nodes, in order), `ir` ("aten" when any target is an ATen/prims OpOverload, else "torch").
    """

    def __init__(
        self,
        source: PatternSource,
        example_inputs: Sequence[Any] | None = None,
        *,
        decompositions: Mapping[Any, Callable[..., Any]] | None = None,
        literals: LiteralMode = "exact",
        check: Callable[[Any], bool] | None = None,
        name: str | None = None,
    ) -> None:
        if literals not in ("exact", "any"):
            raise ValueError(f"Pattern: literals must be 'exact' or 'any', got {literals!r}")
        self.name = name or _source_name(source)
        self.example_inputs = tuple(example_inputs) if example_inputs is not None else None
        self.decompositions = decompositions
        self.literals: LiteralMode = literals
        self.check = check
        self.module = trace_pattern(source, self.example_inputs, decompositions)
        graph = self.module.graph
        self.placeholders = tuple(n for n in graph.nodes if n.op == "placeholder")
        self.outputs = _outputs_of(graph, self.name)
        # Placeholders traced from a tensor bind only graph values that are tensors.
        self.tensor_inputs = frozenset(
            p for p in self.placeholders if isinstance(node_value(p), torch.Tensor)
        )
        self.nodes = tuple(n for n in graph.nodes if n.op not in ("placeholder", "output"))
        self.ir = "aten" if any(isinstance(n.target, OpOverload) for n in self.nodes) else "torch"
        self.keys: dict[fx.Node, Hashable] = {n: op_key(n) for n in self.nodes}
        self.args = {n: normalized_args(n) for n in self.nodes}
        self.anchor = _pick_anchor(self.outputs)
        # (position, op key) of the anchor's positional arguments that are pattern nodes: a
        # cheap filter applied before any matching state is built.
        self.anchor_arg_keys = tuple(
            (i, self.keys[a])
            for i, a in enumerate(self.args[self.anchor][0])
            if isinstance(a, fx.Node) and a.op != "placeholder"
        )
        self.constants = {
            n: _fetch(self.module, str(n.target)) for n in self.nodes if n.op == "get_attr"
        }

    @property
    def anchor_key(self) -> Hashable:
        return self.keys[self.anchor]

    def __repr__(self) -> str:
        ops = ", ".join(_short(n) for n in self.nodes[:6]) + (", ..." if len(self.nodes) > 6 else "")
        return f"Pattern({self.name}: {self.ir} IR, {len(self.nodes)} nodes: {ops})"


def as_pattern(source: Pattern | PatternSource) -> Pattern:
    """`source` itself when it is a Pattern, else `Pattern(source)` (Torch IR tracing)."""
    return source if isinstance(source, Pattern) else Pattern(source)


def trace_pattern(
    source: PatternSource,
    example_inputs: tuple[Any, ...] | None,
    decompositions: Mapping[Any, Callable[..., Any]] | None = None,
) -> fx.GraphModule:
    """A fresh GraphModule for `source` (see `Pattern`), dead code removed."""
    if isinstance(source, fx.GraphModule):
        gm = fx.GraphModule(source, _copy_graph(source.graph))
    elif isinstance(source, fx.Graph):
        root = source.owning_module if source.owning_module is not None else torch.nn.Module()
        gm = fx.GraphModule(root, _copy_graph(source))
    elif callable(source):
        if example_inputs is None:
            if decompositions is not None:
                raise ValueError("Pattern: decompositions need example_inputs (make_fx tracing)")
            if not isinstance(source, (types.FunctionType, torch.nn.Module)):
                raise TypeError(
                    f"Pattern: fx.symbolic_trace needs a Python function or nn.Module, got "
                    f"{source!r}; wrap it (`lambda x: torch.relu(x)`) or give example_inputs "
                    "to trace it with make_fx"
                )
            gm = fx.symbolic_trace(source)
        else:
            tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
            if len({id(t) for t in tensors}) != len(tensors):
                raise ValueError(
                    "Pattern: example_inputs holds the same tensor twice; make_fx would trace "
                    "both inputs as one. Pass distinct tensors"
                )
            gm = make_fx(source, decomposition_table=decompositions)(*example_inputs)
    else:
        raise TypeError(
            f"Pattern: expected a function, nn.Module, fx.GraphModule or fx.Graph, got "
            f"{type(source).__name__}"
        )
    if gm.graph.eliminate_dead_code():
        gm.recompile()
    return gm


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    copy = fx.Graph()
    env: dict[fx.Node, Any] = {}
    output = copy.graph_copy(graph, env)
    copy.output(output)
    return copy


def _outputs_of(graph: fx.Graph, name: str) -> tuple[fx.Node, ...]:
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    flat = [v for v in _flatten(output.args[0])]
    for value in flat:
        if not isinstance(value, fx.Node) or value.op == "placeholder":
            raise ValueError(
                f"Pattern {name}: output {value!r} is an input or a constant; a pattern must "
                "compute each of its outputs"
            )
    if len(set(flat)) != len(flat):
        raise ValueError(f"Pattern {name}: the same node is returned twice")
    if not flat:
        raise ValueError(f"Pattern {name}: returns nothing")
    return tuple(flat)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [item for v in value for item in _flatten(v)]
    return [value]


def _pick_anchor(outputs: tuple[fx.Node, ...]) -> fx.Node:
    """The output whose input cone holds most pattern nodes (the first on ties)."""
    def cone(node: fx.Node) -> int:
        seen, stack = set(), [node]
        while stack:
            current = stack.pop()
            if current in seen or current.op == "placeholder":
                continue
            seen.add(current)
            stack.extend(current.all_input_nodes)
        return len(seen)

    return max(outputs, key=cone)


def _source_name(source: Any) -> str:
    if isinstance(source, fx.Graph):
        return "graph_pattern"
    name = getattr(source, "__name__", None) or type(source).__name__
    return "pattern" if name == "<lambda>" else name


def _short(node: fx.Node) -> str:
    target = node.target
    return str(target) if isinstance(target, (OpOverload, str)) else getattr(target, "__name__", str(target))


def _fetch(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def literal_equal(a: Any, b: Any) -> bool:
    """Exact equality of two literal arguments: same type (list and tuple alike), same value."""
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return a is b
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(literal_equal(x, y) for x, y in zip(a, b))
        )
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    try:
        return bool(a == b)
    except Exception:  # exotic objects without a usable ==
        return a is b
