"""``RuntimePlan``: what the training runtime needs besides the compiled graphs, as plain data.

The runtime (``runtime.py``) reads the joint graph's input and output records, the partition's
count of saved tensors and the traced inputs' layouts; this module gathers them into one frozen
record that holds no graph and no fake tensor. Symbolic sizes are kept as sympy expressions
(plain ints where they are numbers), so a plan pickles: a caller that stores the compiled
forward and backward graphs with their plan can rebuild the runtime in another process without
tracing again (``AotCompiled.from_plan``).
"""

from __future__ import annotations

import dataclasses

import sympy
import torch

from .joint import JointGraph, JointSignature
from .meta import VAL
from .partitioner import Partition

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def as_expr(value: object) -> object:
    """A traced size as a sympy expression when it is symbolic, else as it is."""
    if isinstance(value, _SYMBOLIC):
        expr = value.node.expr
        return int(expr) if expr.is_number and expr.is_integer else expr
    return value


def is_symbolic(value: object) -> bool:
    return isinstance(value, sympy.Expr) and not value.is_number


@dataclasses.dataclass(frozen=True, slots=True)
class TensorLayout:
    """A traced tensor input: dtype and geometry (ints or sympy expressions)."""

    dtype: torch.dtype
    shape: tuple[object, ...]
    stride: tuple[object, ...]
    storage_offset: object

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorLayout:
        return cls(tensor.dtype, tuple(map(as_expr, tensor.shape)), tuple(map(as_expr, tensor.stride())),
                   as_expr(tensor.storage_offset()))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimePlan(JointSignature):
    """The joint graph's records the runtime reads (``JointSignature``; symbolic view geometry
    as sympy), plus the qualified names of the lifted module tensors (in primal order), each
    primal's traced layout (a ``TensorLayout``, a symbolic scalar as an expression, or None)
    and the number of tensors the forward saves for the backward."""

    lifted_names: tuple[str, ...]
    primal_layouts: tuple[object, ...]
    num_saved_tensors: int


def runtime_plan(joint: JointGraph, partition: Partition) -> RuntimePlan:
    """The plan of running ``joint`` split as ``partition``."""
    layouts = []
    for node in joint.primals:
        value = node.meta.get(VAL)
        if isinstance(value, torch.Tensor):
            layouts.append(TensorLayout.of(value))
        else:
            layouts.append(as_expr(value) if isinstance(value, _SYMBOLIC) else None)
    signature = {f.name: getattr(joint, f.name) for f in dataclasses.fields(JointSignature)}
    signature["outputs"] = tuple(
        dataclasses.replace(o, view=tuple(_exprs(part) for part in o.view)) if o.view is not None else o
        for o in joint.outputs
    )
    return RuntimePlan(
        **signature,
        lifted_names=tuple(entry.names[0] for entry in joint.lifted),
        primal_layouts=tuple(layouts),
        num_saved_tensors=partition.num_saved_tensors,
    )


def _exprs(part: object) -> object:
    if isinstance(part, (tuple, list)):
        return tuple(as_expr(v) for v in part)
    return as_expr(part)
