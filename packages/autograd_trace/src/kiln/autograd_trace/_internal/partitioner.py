"""``partition_joint``: split a ``JointGraph`` into forward and backward graphs.

Calling conventions of the two graphs (the runtime and any compiler rely on them):

- ``fw_gm(*primals) -> (*forward_outputs, *saved_tensors, *saved_sizes)``
- ``bw_gm(*saved_tensors, *saved_sizes, *tangents) -> (*grads)``, one grad per
  ``joint.grad_inputs`` entry.

``"save_all"`` runs in the forward exactly what the forward outputs need (plus random ops) and
saves every forward value the backward reads. ``"min_cut"`` saves the cheapest set of values
from which the backward can recompute the rest (see ``min_cut.py`` / ``recompute.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from .joint import JointGraph
from .meta import RECOMPUTED, VAL
from .min_cut import min_cut_saved_values
from .recompute import (
    LEVELS,
    RecomputePolicy,
    is_random,
    is_symbolic_value,
    recompute_recipe,
    size_hint,
    storage_bytes,
)

log = logging.getLogger(__name__)

STRATEGIES = ("save_all", "min_cut")


@dataclasses.dataclass(frozen=True, slots=True)
class SavedValue:
    """One value the forward hands to the backward, and why."""

    name: str
    kind: str  # "tensor" or "size"
    nbytes: int
    is_input: bool
    reason: str
    shape: tuple[int, ...] = ()
    dtype: str = ""

    def __str__(self) -> str:
        what = (
            f"{self.dtype}{list(self.shape)} {self.nbytes} B" if self.kind == "tensor" else "size"
        )
        return f"{self.name}: {what} ({self.reason})"


@dataclasses.dataclass(frozen=True)
class Partition:
    """Forward and backward graphs plus the record of what is saved; unpacks as ``fw, bw``.

    ``saved_bytes`` counts each saved storage once (size hints for symbolic sizes);
    ``activation_bytes`` leaves out the storages of graph inputs, which are alive anyway.
    """

    fw_gm: torch.fx.GraphModule
    bw_gm: torch.fx.GraphModule
    saved: tuple[SavedValue, ...]
    recomputed: tuple[str, ...]
    strategy: str
    recompute_level: str | None
    memory_budget: int | None
    budget_met: bool
    num_forward_outputs: int
    saved_bytes: int
    activation_bytes: int

    @property
    def num_saved_tensors(self) -> int:
        return sum(1 for s in self.saved if s.kind == "tensor")

    @property
    def num_saved_sizes(self) -> int:
        return sum(1 for s in self.saved if s.kind == "size")

    def __iter__(self):  # lets `fw_gm, bw_gm = partition_joint(...)` work
        return iter((self.fw_gm, self.bw_gm))

    def __str__(self) -> str:
        level = f", recompute level {self.recompute_level!r}" if self.recompute_level else ""
        budget = ""
        if self.memory_budget is not None:
            budget = f", budget {self.memory_budget} B ({'met' if self.budget_met else 'NOT met'})"
        lines = [
            f"Partition[{self.strategy}{level}{budget}]: {self.num_saved_tensors} tensors "
            f"({self.saved_bytes} B, {self.activation_bytes} B beyond inputs) and "
            f"{self.num_saved_sizes} sizes saved; {len(self.recomputed)} nodes recomputed",
        ]
        lines += [f"  {value}" for value in self.saved]
        if self.recomputed:
            lines.append(f"  recomputed in backward: {', '.join(self.recomputed)}")
        return "\n".join(lines)


def partition_joint(
    joint: JointGraph, strategy: str = "save_all", *, memory_budget: int | None = None
) -> Partition:
    """Split ``joint`` into ``(fw_gm, bw_gm)`` with a record of what is saved and why.

    ``strategy`` is ``"save_all"`` or ``"min_cut"``. ``memory_budget`` (bytes, ``min_cut``
    only) lets the backward recompute more expensive ops (reductions, then matmuls) until the
    saved bytes fit; ``Partition.budget_met`` says whether they did. Random ops are never
    recomputed. Returns a ``Partition`` (it unpacks as ``fw_gm, bw_gm``).
    """
    if strategy not in STRATEGIES:
        raise ValueError(
            f"kiln.autograd_trace: unknown partition strategy {strategy!r}; use one of {STRATEGIES}"
        )
    if memory_budget is not None and strategy != "min_cut":
        raise ValueError("kiln.autograd_trace: memory_budget needs strategy='min_cut'")
    backward_side = _depends_on(joint.tangents, joint.gm.graph)
    if strategy == "save_all":
        choice = _save_all_choice(joint, backward_side)
    else:
        choice = _min_cut_choice(joint, backward_side, memory_budget)
    return _build(joint, backward_side, choice, strategy, memory_budget)


@dataclasses.dataclass(frozen=True)
class _Choice:
    is_saved: Callable[[torch.fx.Node], bool]
    reasons: dict[torch.fx.Node, str]
    level: str | None
    budget_met: bool


def _save_all_choice(joint: JointGraph, backward_side: set[torch.fx.Node]) -> _Choice:
    roots = [n for n in joint.forward_output_nodes if isinstance(n, torch.fx.Node)]
    roots += [n for n in joint.gm.graph.nodes if is_random(n) and n not in backward_side]
    forward = _ancestors(roots) | set(joint.primals)
    for node in joint.gm.graph.nodes:
        if node.target is operator.getitem and node.args[0] in forward:
            forward.add(node)
    return _Choice(forward.__contains__, {}, None, True)


def _min_cut_choice(
    joint: JointGraph, backward_side: set[torch.fx.Node], memory_budget: int | None
) -> _Choice:
    nodes = [n for n in joint.gm.graph.nodes if n.op != "output"]
    forward_side = [n for n in nodes if n not in backward_side]
    read_by_backward = {
        used for node in backward_side for used in node.all_input_nodes if used not in backward_side
    }
    read_by_backward |= {
        g for g in joint.grad_nodes if isinstance(g, torch.fx.Node) and g not in backward_side
    }
    for level in range(len(LEVELS)):
        cut = min_cut_saved_values(forward_side, read_by_backward, RecomputePolicy(level))
        nbytes = _unique_bytes(cut.saved)
        fits = memory_budget is None or nbytes <= memory_budget
        if fits or level == len(LEVELS) - 1:
            break
        log.info(
            "min cut at level %s saves %d B > budget %d B: recomputing more",
            LEVELS[level],
            nbytes,
            memory_budget,
        )
    if not fits:
        log.warning(
            "kiln.autograd_trace: memory budget %d B not met: even recomputing every deterministic "
            "op saves %d B (inputs and random ops must be saved)",
            memory_budget,
            nbytes,
        )
    saved = set(cut.saved)
    return _Choice(saved.__contains__, cut.not_recomputable, LEVELS[level], fits)


@dataclasses.dataclass
class _BackwardPlan:
    saved_tensors: list[torch.fx.Node]
    saved_sizes: list[torch.fx.Node]
    nodes: set[torch.fx.Node]  # computed by the backward graph (recomputed or tangent-dependent)


def _plan_backward(
    joint: JointGraph, backward_side: set[torch.fx.Node], is_saved: Callable[[torch.fx.Node], bool]
) -> _BackwardPlan:
    tangents = set(joint.tangents)
    saved: set[torch.fx.Node] = set()
    sizes: set[torch.fx.Node] = set()
    nodes: set[torch.fx.Node] = set()
    stack = [g for g in joint.grad_nodes if isinstance(g, torch.fx.Node)]
    while stack:
        node = stack.pop()
        if node in tangents or node in saved or node in sizes or node in nodes:
            continue
        if node not in backward_side and is_symbolic_value(node):
            sizes.add(node)
        elif node not in backward_side and is_saved(node):
            saved.add(node)
        elif node.op == "placeholder":
            raise AssertionError(
                f"the backward needs graph input {node.name!r}, which is not saved"
            )
        else:
            nodes.add(node)
            recipe = recompute_recipe(node) if node not in backward_side else None
            stack.extend(recipe.inputs if recipe else node.all_input_nodes)
    order = {n: i for i, n in enumerate(joint.gm.graph.nodes)}
    return _BackwardPlan(sorted(saved, key=order.get), sorted(sizes, key=order.get), nodes)


def _build(
    joint: JointGraph,
    backward_side: set[torch.fx.Node],
    choice: _Choice,
    strategy: str,
    memory_budget: int | None,
) -> Partition:
    plan = _plan_backward(joint, backward_side, choice.is_saved)
    in_forward = _forward_nodes(joint, plan)
    fw_gm = _forward_graph(joint, plan, in_forward)
    bw_gm = _backward_graph(joint, plan, in_forward, backward_side)
    saved = [_describe(n, plan, choice, strategy, backward_side) for n in plan.saved_tensors]
    saved += [
        SavedValue(n.name, "size", 0, n.op == "placeholder", "size the backward needs")
        for n in plan.saved_sizes
    ]
    primal_storages = {_storage_key(p) for p in joint.primals} - {None}
    recomputed = [n.name for n in joint.gm.graph.nodes if n in plan.nodes and n in in_forward]
    partition = Partition(
        fw_gm=fw_gm,
        bw_gm=bw_gm,
        saved=tuple(saved),
        recomputed=tuple(recomputed),
        strategy=strategy,
        recompute_level=choice.level,
        memory_budget=memory_budget,
        budget_met=choice.budget_met,
        num_forward_outputs=joint.num_forward_outputs,
        saved_bytes=_unique_bytes(plan.saved_tensors),
        activation_bytes=_unique_bytes(
            n for n in plan.saved_tensors if _storage_key(n) not in primal_storages
        ),
    )
    log.debug("%s", partition)
    return partition


def _forward_outputs(joint: JointGraph, plan: _BackwardPlan) -> list[object]:
    return list(joint.forward_output_nodes) + plan.saved_tensors + plan.saved_sizes


def _forward_nodes(joint: JointGraph, plan: _BackwardPlan) -> set[torch.fx.Node]:
    outputs = _forward_outputs(joint, plan)
    return _ancestors(n for n in outputs if isinstance(n, torch.fx.Node)) | set(joint.primals)


def _forward_graph(
    joint: JointGraph, plan: _BackwardPlan, in_forward: set[torch.fx.Node]
) -> torch.fx.GraphModule:
    outputs = _forward_outputs(joint, plan)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in joint.gm.graph.nodes:
        if node in in_forward:
            env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[n] if isinstance(n, torch.fx.Node) else n for n in outputs))
    return _module(joint, graph)


def _backward_graph(
    joint: JointGraph,
    plan: _BackwardPlan,
    in_forward: set[torch.fx.Node],
    backward_side: set[torch.fx.Node],
) -> torch.fx.GraphModule:
    """Saved values and tangents in; nodes in the forward too are marked recomputed."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in [*plan.saved_tensors, *plan.saved_sizes, *joint.tangents]:
        env[node] = graph.placeholder(node.name)
        env[node].meta[VAL] = node.meta.get(VAL)
    for node in joint.gm.graph.nodes:
        if node in plan.nodes:
            recipe = recompute_recipe(node) if node not in backward_side else None
            if recipe is not None:
                env[node] = recipe.emit(graph, env.__getitem__)
            else:
                env[node] = graph.node_copy(node, env.__getitem__)
            if node in in_forward:
                env[node].meta[RECOMPUTED] = True
    graph.output(tuple(env[g] for g in joint.grad_nodes))
    return _module(joint, graph)


def build_inference_graph(joint: JointGraph) -> torch.fx.GraphModule:
    """``(*primals) -> (*forward_outputs)``: the forward for calls that need no gradients."""
    plan = _BackwardPlan([], [], set())
    return _forward_graph(joint, plan, _forward_nodes(joint, plan))


def _module(joint: JointGraph, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    graph.lint()
    return torch.fx.GraphModule(joint.gm, graph)


def _describe(
    node: torch.fx.Node,
    plan: _BackwardPlan,
    choice: _Choice,
    strategy: str,
    backward_side: set[torch.fx.Node],
) -> SavedValue:
    readers = [u.name for u in node.users if u in plan.nodes][:3]
    read = f"read by {', '.join(readers)}" if readers else "a gradient itself"
    if node.op == "placeholder":
        reason = f"graph input, {read}"
    elif strategy == "save_all":
        reason = f"computed by the forward, {read}"
    elif node in choice.reasons:
        reason = f"{choice.reasons[node]}; {read}"
    else:
        reason = f"min cut: cheaper to save than to recompute; {read}"
    value = node.meta.get(VAL)
    return SavedValue(
        name=node.name,
        kind="tensor",
        nbytes=storage_bytes(node) or 0,
        is_input=node.op == "placeholder",
        reason=reason,
        shape=tuple(size_hint(s) for s in value.shape) if isinstance(value, torch.Tensor) else (),
        dtype=str(value.dtype).removeprefix("torch.") if isinstance(value, torch.Tensor) else "",
    )


def _depends_on(sources: Sequence[torch.fx.Node], graph: torch.fx.Graph) -> set[torch.fx.Node]:
    reached = set(sources)
    for node in graph.nodes:
        if node.op != "output" and any(i in reached for i in node.all_input_nodes):
            reached.add(node)
    return reached


def _ancestors(roots: Iterable[torch.fx.Node]) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


def _storage_key(node: torch.fx.Node) -> object:
    value = node.meta.get(VAL)
    if not isinstance(value, torch.Tensor):
        return None
    return StorageWeakRef(value.untyped_storage())


def _unique_bytes(nodes: Iterable[torch.fx.Node]) -> int:
    by_storage: dict[object, int] = {}
    for node in nodes:
        key = _storage_key(node)
        if key is not None:
            by_storage[key] = max(by_storage.get(key, 0), storage_bytes(node) or 0)
    return sum(by_storage.values())
