"""In-place ops whose mutation nobody can observe, replaced by their out-of-place form.

Functionalization leaves some in-place ops in ATen graphs: those that torch's
CompositeImplicitAutograd kernels apply to temporaries they just made (matmul's
``squeeze_``, cosine_embedding_loss's ``clamp_min_``/``sqrt_``, ...), and decompose()'s
own retrace runs such kernels too. They are outside any loop-level opset, yet the
mutation is invisible when the mutated tensor

* is produced in the graph by an op that returns a fresh tensor (not a view, not an
  input or attribute), or is a chain of views of such a tensor (instance_norm's
  ``native_batch_norm`` writes running statistics into a view of a clone), and
* is read after the in-place op by nobody but the in-place op's output users (reads that
  come before it see the old values either way), nor is any tensor of its view chain,

and the out-of-place op gives the same dtype and shape (checked by running it on the
nodes' fake values: no type promotion, no broadcasting).
Then ``aten.foo_.overload`` is replaced by ``aten.foo.overload``.
"""

from __future__ import annotations

import contextlib
import logging
import operator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch._ops import OpOverload
from torch.fx.experimental.symbolic_shapes import statically_known_true

log = logging.getLogger(__name__)


def functional_variant(op: OpOverload) -> OpOverload | None:
    """``aten.foo.ov`` for an in-place ``aten.foo_.ov`` that mutates only its first
    argument and returns it; None otherwise."""
    schema = op._schema
    name = op.overloadpacket.__name__
    if not name.endswith("_") or name.startswith("_") and name.endswith("__"):
        return None
    writes = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(writes) != 1 or writes[0] is not schema.arguments[0] or len(schema.returns) != 1:
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    if packet is None:
        return None
    # the same overload name when it takes the same arguments (pow_.Scalar is
    # pow.Tensor_Scalar: pow.Scalar takes a Scalar base), else any overload that does
    names = [op._overloadname] + [o for o in packet.overloads() if o != op._overloadname]
    for overload in names:
        functional = getattr(packet, overload, None)
        if (
            isinstance(functional, OpOverload)
            and not functional._schema.is_mutable
            and _signature(functional) == _signature(op)
        ):
            return functional
    return None


def _signature(op: OpOverload) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in op._schema.arguments]


def unobservable_inplace_nodes(graph: fx.Graph) -> dict[fx.Node, OpOverload]:
    """The in-place call_function nodes of ``graph`` that may become out-of-place,
    mapped to that out-of-place op."""
    result: dict[fx.Node, OpOverload] = {}
    order = {n: i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        functional = functional_variant(node.target)
        if functional is None or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        mutated = node.args[0]
        fresh = _fresh_base(mutated, result, node, order)
        if fresh and _same_result(node, functional):
            result[node] = functional
    return result


def functionalize_unobservable_inplace(graph: fx.Graph) -> set[OpOverload]:
    """Rewrite, in ``graph``, the nodes ``unobservable_inplace_nodes`` finds; return the
    out-of-place ops they became."""
    replaced = unobservable_inplace_nodes(graph)
    for node, functional in replaced.items():
        node.target = functional
    if replaced:
        log.debug("made %d in-place ops out-of-place", len(replaced))
    return set(replaced.values())


def _fresh_base(
    node: fx.Node, converted: dict[fx.Node, OpOverload], writer: fx.Node, order: dict[fx.Node, int]
) -> bool:
    """``node`` (written by ``writer``) is fresh (a converted op's output is) or a view of
    a fresh tensor, and nothing reads it or the tensors of its view chain after ``writer``
    (other than through the chain itself)."""
    below = writer
    while True:
        for user in node.users:  # earlier plain reads see the old values anyway; a view
            if user is not below and (order[user] > order[writer] or _aliases(user)):
                return False  # read later, or an alias whose reads may come later
        if node in converted or _is_fresh(node):
            return True
        if not _is_view(node) or not isinstance(node.args[0], fx.Node):
            return False
        below, node = node, node.args[0]


def _aliases(node: fx.Node) -> bool:
    """``node``'s output may share memory with its inputs (a view, or an in-place op)."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, OpOverload):
        return node.op != "output"  # unknown callables: assume they may alias
    return any(r.alias_info is not None for r in target._schema.returns)


def _is_view(node: fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, OpOverload):
        return False
    returns = target._schema.returns
    return (
        len(returns) == 1
        and returns[0].alias_info is not None
        and not returns[0].alias_info.is_write
        and functional_variant(target) is None
    )


def _is_fresh(node: fx.Node) -> bool:
    """``node`` is a new tensor made in the graph: not an input, attribute or view."""
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        source = node.args[0]
        return isinstance(source, fx.Node) and _returns_fresh(source.target)
    if isinstance(target, OpOverload) and functional_variant(target) is not None:
        return False  # the output of a kept in-place op aliases its input
    return _returns_fresh(target)


def _returns_fresh(target: object) -> bool:
    if not isinstance(target, OpOverload):
        return False
    return all(r.alias_info is None for r in target._schema.returns)


def _same_result(node: fx.Node, functional: OpOverload) -> bool:
    """The out-of-place op, run on the nodes' fake values, gives the in-place op's dtype
    and shape (no type promotion, no broadcasting beyond the mutated tensor)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    inputs = node.all_input_nodes
    if any("val" not in n.meta for n in inputs):
        return False
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
    fake_mode = detect_fake_mode(pytree.tree_leaves((args, kwargs)))
    if fake_mode is None:  # real tensors as values (hand-built graphs): run on meta
        args, kwargs = pytree.tree_map_only(
            torch.Tensor, lambda t: torch.empty_like(t, device="meta"), (args, kwargs)
        )
    try:
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            out = functional(*args, **kwargs)
    except Exception:  # the functional form does not accept these arguments
        return False
    return (
        isinstance(out, torch.Tensor)
        and out.dtype == val.dtype
        and len(out.shape) == len(val.shape)
        and all(statically_known_true(a == b) for a, b in zip(out.shape, val.shape))
    )
