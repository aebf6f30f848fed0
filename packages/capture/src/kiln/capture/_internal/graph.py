"""``CapturedGraph``: one FX graph as a frontend handed it over, with where it came from."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kiln.capture._internal.breaks import GraphBreak, break_from_compile_reason
from kiln.capture._internal.inputs import InputSpec, describe_inputs, placeholder_sources
from kiln.capture._internal.source import SourceLocation, graph_source

log = logging.getLogger(__name__)

IRKind = Literal["torch", "aten"]
_COMPUTE_OPS = ("call_function", "call_method", "call_module")


# eq=False: fields hold tensors and modules, whose == is element-wise or identity.
@dataclass(frozen=True, slots=True, eq=False)
class CapturedGraph:
    """One captured FX graph.

    ``gm`` is the graph (Torch IR from Dynamo, ATen IR from torch.export) and takes
    ``example_inputs`` positionally, one per placeholder; those may be FakeTensors and are
    never read. ``index`` is the order of capture, ``source`` the user line the graph starts
    at, ``graph_break`` the break that ended the graph (None when it ran to a return),
    ``ir`` says which IR the graph is in, ``compile_id`` is Dynamo's id of the compile
    that produced it (``"0/1"``: frame 0, second compile, so a recompile; None outside
    Dynamo) and ``input_sources`` Dynamo's name for each input (``L['x']``).
    """

    gm: torch.fx.GraphModule
    example_inputs: tuple[Any, ...]
    index: int = 0
    source: SourceLocation | None = None
    graph_break: GraphBreak | None = None
    ir: IRKind = "torch"
    compile_id: str | None = None
    input_sources: tuple[str | None, ...] = ()

    @classmethod
    def from_backend(
        cls, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], index: int = 0
    ) -> CapturedGraph:
        """Record a graph from inside a Dynamo backend, ``backend(gm, example_inputs)``.

        Reads only graph structure and node metadata: safe with FakeTensor inputs.
        """
        graph_break = break_from_compile_reason(getattr(gm, "compile_subgraph_reason", None))
        record = cls(
            gm=gm,
            example_inputs=tuple(example_inputs),
            index=index,
            source=graph_source(gm),
            graph_break=graph_break,
            ir="torch",
            compile_id=current_compile_id(gm),
            input_sources=placeholder_sources(gm),
        )
        log.debug("captured %s", record)
        return record

    def op_counts(self) -> Counter[str]:
        """How many times each op is called, keyed by a readable op name."""
        return Counter(op_name(node) for node in self.gm.graph.nodes if node.op in _COMPUTE_OPS)

    def input_specs(self) -> tuple[InputSpec, ...]:
        """Shape, strides, dtype (symbolic sizes as ``s77``) and origin of each input."""
        return describe_inputs(self.gm, self.example_inputs, self.input_sources)

    @property
    def num_ops(self) -> int:
        """Number of call nodes in the graph."""
        return sum(1 for node in self.gm.graph.nodes if node.op in _COMPUTE_OPS)

    def __str__(self) -> str:
        counts = self.op_counts()
        ops = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counts.most_common())
        where = (
            f" from {self.source.short} in {self.source.display_function}" if self.source else ""
        )
        plural = "" if self.num_ops == 1 else "s"
        head = f"graph {self.index} ({self.ir} IR, {self.num_ops} op{plural}){where}"
        tail = f"\n  ended by {self.graph_break}" if self.graph_break else ""
        return f"{head}: {ops or '(no ops)'}{tail}"


def current_compile_id(gm: torch.fx.GraphModule) -> str | None:
    """Dynamo's compile id for ``gm`` (``"0/1"``), from the graph or the running compile."""
    compile_id = gm.meta.get("dynamo_compile_id")
    if compile_id is None:
        try:
            compile_id = torch._guards.CompileContext.current_compile_id()
        except AttributeError:  # no compile context in this torch version
            compile_id = None
    return None if compile_id is None else str(compile_id)


def op_name(node: torch.fx.Node) -> str:
    """A readable name for what a call node calls: ``aten.add.Tensor``, ``Tensor.sin``, ..."""
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        owner = node.graph.owning_module
        try:
            kind = type(owner.get_submodule(str(node.target))).__name__
        except AttributeError:
            kind = str(node.target)
        return f"module:{kind}"
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    try:
        name = torch.fx.node._get_qualified_name(target)
    except (AttributeError, RuntimeError, TypeError):
        name = getattr(target, "__name__", repr(target))
    return name.replace("_operator.", "operator.", 1)
