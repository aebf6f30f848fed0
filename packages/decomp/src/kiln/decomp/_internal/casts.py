"""Explicit casts, and the folding of cast pairs where the fold is exact.

Autocast and the decompositions written for low precision (compute in float32, round back)
leave chains of dtype casts: ``bf16 -> fp32 -> bf16`` around an op that autocast runs in the
storage dtype, ``fp16 -> fp32 -> fp64``, ``prims.convert_element_type`` from torch's own
decompositions. The loop-level opset keeps every cast explicit as ``aten._to_copy`` (dtype
only), and this pass folds a pair ``cast(cast(x, T1), T2)`` only where the result is
bit for bit the same:

- ``T1`` represents every value of ``x``'s dtype ``S`` exactly (a lossless widening:
  bf16/fp16 -> fp32 -> fp64, small integers -> wider integers or floats with enough mantissa,
  bool -> anything), so the first cast loses nothing; and
- ``T2`` is ``S`` again (the round trip is the identity) or another lossless widening of ``S``
  (both paths give the exact value).

So ``bf16 -> fp32 -> bf16`` folds, ``fp32 -> bf16 -> fp32`` (rounds) and ``int32 -> fp32 ->
int32`` (fp32 has 24 bits of mantissa) stay, and ``bf16 -> fp32 -> fp16`` stays (bf16 -> fp16
is not lossless: the direct cast might round differently from eager's two casts).

A cast of a tensor to its own dtype (what a folded round trip becomes) is then dropped, its
users reading the source instead, when that changes nothing observable: the users are ops
that neither alias nor mutate their inputs, none is the graph's output (an output must not
become an input or alias another output), and the source has the copy's strides.
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx
from torch._ops import OpOverload
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from .cleanup import eliminate_dead_pure_nodes

log = logging.getLogger(__name__)

aten = torch.ops.aten
_CONVERT_ELEMENT_TYPE = torch.ops.prims.convert_element_type.default

_BOOL = (torch.bool,)
_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# S -> the dtypes holding every value of S exactly (S itself included).
_LOSSLESS: dict[torch.dtype, frozenset[torch.dtype]] = {
    torch.bool: frozenset(_BOOL + _INTEGERS + _FLOATS),
    # 8 significant bits: bf16 holds every 8-bit integer, fp16 (11 bits) too
    torch.uint8: frozenset({torch.uint8, torch.int16, torch.int32, torch.int64, *_FLOATS}),
    torch.int8: frozenset({torch.int8, torch.int16, torch.int32, torch.int64, *_FLOATS}),
    torch.int16: frozenset({torch.int16, torch.int32, torch.int64, torch.float32, torch.float64}),
    torch.int32: frozenset({torch.int32, torch.int64, torch.float64}),
    torch.int64: frozenset({torch.int64}),
    torch.float16: frozenset({torch.float16, torch.float32, torch.float64}),
    torch.bfloat16: frozenset({torch.bfloat16, torch.float32, torch.float64}),
    torch.float32: frozenset({torch.float32, torch.float64}),
    torch.float64: frozenset({torch.float64}),
}

# _to_copy keyword arguments that leave a call a plain dtype cast (the checks are below).
_CAST_KWARGS = frozenset(
    {"dtype", "layout", "device", "pin_memory", "non_blocking", "memory_format"}
)


def is_lossless(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether every value of ``source`` is exactly a value of ``target``."""
    return target in _LOSSLESS.get(source, ())


def folds_exactly(source: torch.dtype, middle: torch.dtype, target: torch.dtype) -> bool:
    """Whether ``cast(cast(x: source, middle), target)`` equals ``cast(x, target)``, bit for
    bit, by the rules in this module's docstring."""
    if not is_lossless(source, middle):
        return False
    return target == source or is_lossless(source, target)


def fold_exact_casts(gm: fx.GraphModule) -> tuple[fx.GraphModule, bool]:
    """Make ``prims.convert_element_type`` an ``aten._to_copy`` cast, fold exact cast pairs,
    drop identity casts nobody can tell apart from their source; ``gm`` is changed in place.
    Returns ``(gm, modified)``."""
    graph = gm.graph
    normalized = sum(_normalize_convert_element_type(node) for node in list(graph.nodes))
    folded = sum(_fold_pair(node) for node in graph.nodes)
    dropped = sum(_drop_identity_cast(node) for node in list(graph.nodes))
    removed = eliminate_dead_pure_nodes(graph) if folded or dropped else 0
    modified = bool(normalized or folded or dropped)
    if modified:
        graph.lint()
        gm.recompile()
        log.debug(
            "casts: %d convert_element_type made _to_copy, %d pairs folded, %d identity casts "
            "dropped, %d dead nodes removed",
            normalized,
            folded,
            dropped,
            removed,
        )
    return gm, modified


def _tensor_val(node: object) -> torch.Tensor | None:
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None


def _plain_cast_source(node: fx.Node) -> fx.Node | None:
    """The input of ``node`` when it is an ``aten._to_copy`` that only changes the dtype (same
    device, strided, strides preserved) between the dtypes this pass knows; else None."""
    if node.op != "call_function" or node.target is not aten._to_copy.default:
        return None
    if len(node.args) != 1 or not set(node.kwargs) <= _CAST_KWARGS:
        return None
    source, out = node.args[0], _tensor_val(node)
    source_val = _tensor_val(source)
    if source_val is None or out is None:
        return None
    kwargs = node.kwargs
    if kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory"):
        return None
    if kwargs.get("memory_format") not in (None, torch.preserve_format):
        return None
    if (
        out.device != source_val.device
        or out.layout != torch.strided
        or source_val.layout != torch.strided
    ):
        return None
    if source_val.dtype not in _LOSSLESS or out.dtype not in _LOSSLESS:
        return None
    return source


def _same_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dim() != b.dim():
        return False
    return all(statically_known_true(x == y) for x, y in zip(a.stride(), b.stride()))


def _normalize_convert_element_type(node: fx.Node) -> bool:
    """``prims.convert_element_type(x, dtype)`` -> ``aten._to_copy(x, dtype=dtype)``: the same
    conversion, in the one cast op of the loop-level opset."""
    if node.op != "call_function" or node.target is not _CONVERT_ELEMENT_TYPE:
        return False
    if len(node.args) != 2 or node.kwargs:
        return False
    source, dtype = node.args
    source_val = _tensor_val(source)
    if source_val is None:
        return False
    with node.graph.inserting_before(node):
        cast = node.graph.call_function(aten._to_copy.default, (source,), {"dtype": dtype})
    cast.meta = dict(node.meta)
    val = aten._to_copy.default(source_val, dtype=dtype)  # a FakeTensor of the source's mode
    cast.meta["val"] = val
    cast.meta["tensor_meta"] = _extract_tensor_metadata(val)
    node.replace_all_uses_with(cast)
    node.graph.erase_node(node)
    return True


def _fold_pair(outer: fx.Node) -> bool:
    """``cast(cast(x, T1), T2)`` -> ``cast(x, T2)`` when that is exact; the inner cast stays
    for its other users (or goes as dead code)."""
    inner = _plain_cast_source(outer)
    if inner is None or _plain_cast_source(inner) is None:
        return False
    source = inner.args[0]
    source_val, middle_val = _tensor_val(source), _tensor_val(inner)
    if not folds_exactly(source_val.dtype, middle_val.dtype, outer.meta["val"].dtype):
        return False
    if not _same_strides(source_val, middle_val):  # outer's strides follow its input's
        return False
    outer.replace_input_with(inner, source)
    return True


def _reads_without_aliasing(user: fx.Node) -> bool:
    """A call of an op that neither mutates nor returns a view of its inputs."""
    if user.op != "call_function" or not isinstance(user.target, OpOverload):
        return False
    schema = user.target._schema
    if schema.is_mutable:
        return False
    return all(r.alias_info is None for r in schema.returns)


def _drop_identity_cast(node: fx.Node) -> bool:
    source = _plain_cast_source(node)
    if source is None:
        return False
    source_val, val = _tensor_val(source), node.meta["val"]
    if source_val.dtype != val.dtype or not _same_strides(source_val, val):
        return False
    if not node.users or not all(_reads_without_aliasing(user) for user in node.users):
        return False
    node.replace_all_uses_with(source)
    node.graph.erase_node(node)
    return True
