"""Which joint-graph nodes the backward may recompute instead of saving, and at what cost.

Recompute levels (the ``min_cut`` partitioner starts at level 0 and only climbs when a memory
budget asks for it):

- level 0 ``"cheap"``: views, pointwise ops, tensor creation without randomness, copies,
  getitem, cat/pad: memory-bound ops a compiler fuses into their consumers;
- level 1 ``"reductions"``: also reductions, softmax and normalizations;
- level 2 ``"all"``: every deterministic op, matmuls and convolutions included.

Random ops (``Tag.nondeterministic_seeded``) are never recomputed, at any level: the backward
must see the very values the forward drew. Ops with side effects are never recomputed either.

Recipes: a few values the backward cannot recompute with their own op can be recomputed by
another formula from other forward values. ``native_dropout(x)[0]`` is ``x * mask * scale``
(exactly what the CPU and CUDA kernels compute) from its saved mask ``native_dropout(x)[1]``,
so attention and residual dropout need not save a float tensor next to their bool mask.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Callable

import torch
import torch.fx

from .meta import VAL
from .opclass import SYMBOLIC_ARITHMETIC, is_mutating, is_op_overload

log = logging.getLogger(__name__)

aten = torch.ops.aten

LEVELS = ("cheap", "reductions", "all")
UNBACKED_SIZE_GUESS = 1024

_CHEAP_PACKETS = frozenset(
    {
        aten.clone,
        aten._to_copy,
        aten._unsafe_view,
        aten.reshape,
        aten.cat,
        aten.constant_pad_nd,
        aten.where,
        aten.masked_fill,
        aten.zeros_like,
        aten.ones_like,
        aten.full_like,
        aten.empty_like,
        aten.scalar_tensor,
        aten.lift_fresh_copy,
        aten.fill,
        aten.alias,
    }
)

_REDUCTION_PACKETS = frozenset(
    {
        aten.sum,
        aten.mean,
        aten.amax,
        aten.amin,
        aten.max,
        aten.min,
        aten.prod,
        aten.var,
        aten.var_mean,
        aten.std,
        aten.logsumexp,
        aten._softmax,
        aten._log_softmax,
        aten.native_layer_norm,
        aten.native_group_norm,
        aten._native_batch_norm_legit_functional,
        aten._native_batch_norm_legit_no_training,
        aten.cumsum,
        aten.norm,
        aten.linalg_vector_norm,
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class RecomputePolicy:
    """Decides, per node, whether the backward may recompute it; ``level`` indexes ``LEVELS``."""

    level: int = 0

    @property
    def name(self) -> str:
        return LEVELS[self.level]

    def why_not_recomputable(self, node: torch.fx.Node) -> str | None:
        """None if the backward may recompute ``node``, else the reason it must be saved."""
        if node.op == "get_attr":
            return None
        if node.op == "placeholder":
            return "graph input"
        if node.op != "call_function":
            return f"{node.op} node"
        target = node.target
        if target is operator.getitem or target in SYMBOLIC_ARITHMETIC:
            return None
        if not is_op_overload(target):
            return f"{target} is not an ATen op"
        if is_random(node):
            return f"random op {target}: never recomputed, the backward must see the forward's draw"
        if is_mutating(target) or not target._schema.returns:
            return f"{target} has side effects"
        if _is_cheap(target) or self.level >= 2:
            return None
        if self.level >= 1 and target.overloadpacket in _REDUCTION_PACKETS:
            return None
        return f"{target} is not recomputed at level {self.name!r}"


def is_random(node: torch.fx.Node) -> bool:
    return (
        node.op == "call_function"
        and is_op_overload(node.target)
        and torch.Tag.nondeterministic_seeded in node.target.tags
    )


def _is_cheap(op: torch._ops.OpOverload) -> bool:
    if op.is_view or torch.Tag.pointwise in op.tags:
        return True
    if op.overloadpacket in _CHEAP_PACKETS:
        return True
    return not any(_is_tensor_type(arg.type) for arg in op._schema.arguments)


def _is_tensor_type(kind: torch._C.JitType) -> bool:
    if isinstance(kind, (torch._C.OptionalType, torch._C.ListType)):
        return _is_tensor_type(kind.getElementType())
    return kind.isSubtypeOf(torch._C.TensorType.get())


def is_symbolic_value(node: torch.fx.Node) -> bool:
    """The node computes a SymInt/SymFloat/SymBool (or plain int) size, not a tensor."""
    value = node.meta.get(VAL)
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def storage_bytes(node: torch.fx.Node) -> int | None:
    """Bytes of the storage behind a tensor node (size hints for symbolic sizes); None if no
    single tensor (tuples, scalars)."""
    value = node.meta.get(VAL)
    if not isinstance(value, torch.Tensor):
        return None
    try:
        nbytes = value.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        nbytes = value.numel() * value.element_size()
    return size_hint(nbytes)


def size_hint(value: object) -> int:
    """An int for a size: the value itself, or the hint of a SymInt (its example value).

    Sizes with no hint (unbacked: data-dependent, e.g. the length of ``nonzero``) count each
    unknown symbol as ``UNBACKED_SIZE_GUESS``.
    """
    if not isinstance(value, torch.SymInt):
        return int(value)
    node = value.node
    hint = getattr(node, "hint", None)
    if hint is not None:
        return int(hint)
    hint = node.shape_env.size_hint(node.expr, allow_none=True)
    if hint is not None:
        return int(hint)
    guess = {symbol: UNBACKED_SIZE_GUESS for symbol in node.expr.free_symbols}
    return int(node.shape_env.replace(node.expr).xreplace(guess))


@dataclasses.dataclass(frozen=True, slots=True)
class Recipe:
    """Recompute ``node`` from ``inputs`` with ``emit(graph, env)`` instead of its own op."""

    node: torch.fx.Node
    inputs: tuple[torch.fx.Node, ...]
    emit: Callable[[torch.fx.Graph, Callable[[torch.fx.Node], torch.fx.Node]], torch.fx.Node]


def recompute_recipe(node: torch.fx.Node) -> Recipe | None:
    """The recipe for ``node``, if it has one (the output of a training-mode dropout)."""
    if node.op != "call_function" or node.target is not operator.getitem or node.args[1] != 0:
        return None
    dropout = node.args[0]
    if not isinstance(dropout, torch.fx.Node) or dropout.target is not aten.native_dropout.default:
        return None
    source, p, train = (list(dropout.args) + [None])[:3]
    train = dropout.kwargs.get("train", train)
    mask = next((u for u in dropout.users if u.target is operator.getitem and u.args[1] == 1), None)
    if mask is None or train is False or not isinstance(source, torch.fx.Node):
        return None
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)

    def emit(graph: torch.fx.Graph, env: Callable[[torch.fx.Node], torch.fx.Node]) -> torch.fx.Node:
        masked = graph.call_function(aten.mul.Tensor, (env(source), env(mask)))
        scaled = graph.call_function(aten.mul.Tensor, (masked, scale))
        masked.meta[VAL] = scaled.meta[VAL] = node.meta.get(VAL)
        return scaled

    return Recipe(node, (source, mask), emit)
