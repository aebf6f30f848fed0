"""Export mode: ``torch.export.export`` and the ATen graph it produces.

The graph handed on is ``ExportedProgram.module()`` (parameters and buffers as attributes,
user inputs as placeholders) re-generated with a flat calling convention: it takes one
positional argument per placeholder and returns a tuple, like a Dynamo graph does. The
original ``ExportedProgram`` is kept on the ``Capture`` for callers that need its
signature or pytree specs.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.source import code_location, graph_source

log = logging.getLogger(__name__)

_GUARDS_FN = "_guards_fn"


def capture_export(
    fn: Callable, args: Sequence[Any], kwargs: Mapping[str, Any], dynamic: bool | None
) -> tuple[CapturedGraph, torch.export.ExportedProgram]:
    """Export ``fn`` (an ``nn.Module`` or a function) and wrap its ATen graph.

    ``dynamic=True`` marks every dimension of every tensor input ``Dim.AUTO`` (torch.export
    keeps a dimension static when the program needs it so); otherwise shapes are static.
    """
    module = fn if isinstance(fn, torch.nn.Module) else function_as_module(fn)
    args, kwargs = tuple(args), dict(kwargs)
    dynamic_shapes = _all_dims_auto(args, kwargs) if dynamic else None
    program = torch.export.export(module, args, kwargs or None, dynamic_shapes=dynamic_shapes)
    unlifted = program.module()
    flat_inputs = _flat_inputs(unlifted, program, args, kwargs)
    gm = with_flat_signature(unlifted)
    source = graph_source(gm, fallback=code_location(fn))
    graph = CapturedGraph(gm, flat_inputs, index=0, source=source, ir="aten")
    log.debug("export captured %s", graph)
    return graph, program


def function_as_module(fn: Callable) -> torch.nn.Module:
    """Wrap a function in an ``nn.Module`` whose ``forward`` has the function's signature.

    The signature matters: torch.export names the graph's placeholders after it.
    """

    class FunctionModule(torch.nn.Module):
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        FunctionModule.forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[self_param, *signature.parameters.values()]
        )
    FunctionModule.__name__ = FunctionModule.__qualname__ = getattr(fn, "__name__", "function")
    return FunctionModule()


def with_flat_signature(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Copy ``gm`` into a plain GraphModule taking one argument per placeholder.

    Drops the pytree flatten/unflatten that ``ExportedProgram.module()`` generates around
    the graph, and its input-guard call (``_guards_fn``, torch >= 2.9): the guards stay
    checked by the ``ExportedProgram``, and later stages expect ATen calls only. Node
    metadata is kept (``Graph.graph_copy`` copies it).
    """
    graph = torch.fx.Graph()
    old_output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    output_value = graph.graph_copy(gm.graph, {})
    graph.output(output_value)
    next(n for n in reversed(graph.nodes) if n.op == "output").meta.update(old_output.meta)
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == _GUARDS_FN and not node.users:
            graph.erase_node(node)
    flat = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    flat.graph.lint()
    return flat


def _all_dims_auto(args: tuple, kwargs: dict) -> Any:
    shapes = torch.export.ShapesCollection()
    for leaf in pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            shapes[leaf] = {dim: torch.export.Dim.AUTO for dim in range(leaf.dim())}
    return shapes


def _flat_inputs(
    unlifted: torch.fx.GraphModule,
    program: torch.export.ExportedProgram,
    args: tuple,
    kwargs: dict,
) -> tuple[Any, ...]:
    """The user inputs in placeholder order (kwargs ordered as the exported signature says)."""
    in_spec = getattr(unlifted, "_in_spec", None) or program.call_spec.in_spec
    try:
        flat = tuple(torch.fx._pytree.tree_flatten_spec((args, kwargs), in_spec))
    except Exception:  # any spec mismatch: fall back to plain flattening
        log.debug("tree_flatten_spec failed; flattening (args, kwargs) in given order")
        flat = tuple(pytree.tree_leaves((args, kwargs)))
    placeholders = [n for n in unlifted.graph.nodes if n.op == "placeholder"]
    if len(flat) != len(placeholders):
        raise RuntimeError(
            f"kiln.capture: the exported graph has {len(placeholders)} placeholders "
            f"({', '.join(n.name for n in placeholders)}) but the inputs flatten to "
            f"{len(flat)} values; pass inputs as tensors or plain containers of tensors"
        )
    return flat
