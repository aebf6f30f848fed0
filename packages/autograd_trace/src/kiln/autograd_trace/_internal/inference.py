"""``trace_inference``: Torch-IR GraphModule -> functional ATen GraphModule, same calling convention."""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from .errors import TraceError
from .fake_inputs import fake_mode_for, fakeify_inputs
from .interpreter import TracingInterpreter
from .lifting import LiftedTensor, add_constant_vals, collect_lifted_tensors, restore_lifted_tensors
from .meta import VAL
from .opclass import is_input_writeback, is_mutating, is_op_overload, remove_unused_pure_nodes
from .rewrites import DeclareHiddenMutations

log = logging.getLogger(__name__)

Decompositions = Mapping[torch._ops.OpOverload, Callable[..., object]]


def trace_inference(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[object],
    decompositions: Decompositions | None = None,
) -> torch.fx.GraphModule:
    """Trace ``gm`` (Torch IR, e.g. from Dynamo) to a functional ATen graph for inference.

    ``example_inputs`` holds one value per placeholder: real tensors, FakeTensors, SymInts or
    ints; no tensor data is read. Inside a Dynamo backend Dynamo's fake mode (and so its
    symbolic sizes) is used; standalone, shapes are static. ``decompositions`` maps OpOverloads
    to Python decompositions applied while tracing.

    Returns a GraphModule with the same placeholders (in order) and output structure as ``gm``;
    its nodes call OpOverloads (plus getitem and SymInt arithmetic) and carry ``meta["val"]``.
    Mutated inputs and buffers are written back with trailing ``aten.copy_`` nodes. Parameters,
    buffers and constants stay get_attr nodes sharing ``gm``'s tensors. Runs under no_grad.
    Raises ``TraceError`` naming the failing node and its user source line.
    """
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise TraceError(
            f"kiln.autograd_trace: the graph has {len(placeholders)} inputs "
            f"({', '.join(p.name for p in placeholders)}) but {len(example_inputs)} example "
            "inputs were given; pass one example value per placeholder"
        )
    fake_mode, found = fake_mode_for(example_inputs)
    fake_inputs = fakeify_inputs(example_inputs, placeholders, fake_mode, static_shapes=not found)
    lifted = collect_lifted_tensors(gm, fake_mode)
    traced = _trace_functional(gm, fake_inputs, lifted, fake_mode, decompositions)
    if _has_internal_mutation(traced.graph):
        traced = _refunctionalize(traced, [*fake_inputs, *(e.fake for e in lifted)], fake_mode)
    removed = remove_unused_pure_nodes(traced.graph)
    result = restore_lifted_tensors(traced, lifted, num_user_inputs=len(fake_inputs))
    add_constant_vals(result, fake_mode)
    _rename_placeholders(result.graph, placeholders, fake_inputs)
    _return_mutated_inputs_themselves(gm, result)
    _reject_aliased_mutated_inputs(result.graph)
    result.graph.lint()
    result.recompile()
    log.debug(
        "traced %d nodes (%d unused removed):\n%s", len(result.graph.nodes), removed, result.code
    )
    return result


def _reject_aliased_mutated_inputs(graph: torch.fx.Graph) -> None:
    """An input written back that shares memory with another input (two views of one tensor):
    the functional graph reads the other one's old value where eager reads the new one (the
    training trace refuses them too). Raises ``TraceError``: the backend then runs the graph
    eagerly, and says so."""
    inputs = [(n, n.meta.get("val")) for n in graph.nodes if n.op == "placeholder"]
    inputs = [(n, v) for n, v in inputs if isinstance(v, torch.Tensor)]
    for node in graph.nodes:
        if node.target is not torch.ops.aten.copy_.default or not isinstance(node.args[0], torch.fx.Node) \
                or node.args[0].op != "placeholder":
            continue
        written = node.args[0]
        for other, value in inputs:
            if other is not written and torch._C._is_alias_of(value, written.meta["val"]):
                raise TraceError(
                    f"kiln.autograd_trace: input {written.name!r} is mutated and shares memory with "
                    f"input {other.name!r}; pass separate tensors (e.g. .clone() one of them)"
                )


_INPLACE_OPERATORS = frozenset({
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
    operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
})


def _mutated_input_of(node: torch.fx.Node) -> torch.fx.Node | None:
    """The placeholder `node` is (itself, or through in-place ops that return their first
    argument: ``x.add_(1)``, ``x += 1``), else None."""
    while True:
        if node.op == "placeholder":
            return node
        name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
        inplace = node.target in _INPLACE_OPERATORS or (
            isinstance(name, str) and name.endswith("_") and not name.startswith("_"))
        if node.op not in ("call_method", "call_function") or not inplace or not node.args \
                or not isinstance(node.args[0], torch.fx.Node):
            return None
        node = node.args[0]


def _return_mutated_inputs_themselves(source: torch.fx.GraphModule, traced: torch.fx.GraphModule) -> None:
    """An output that is an input the graph mutated in place (``x.add_(1); return x``) is that
    input object, as in eager: the functional graph computes its new value, writes it back with
    ``copy_`` and returns the ``copy_`` (which returns the input itself), not the new value."""
    source_out = next(n for n in source.graph.nodes if n.op == "output").args[0]
    traced_out = next(n for n in traced.graph.nodes if n.op == "output")
    if not isinstance(source_out, (tuple, list)) or not isinstance(traced_out.args[0], (tuple, list)):
        return
    source_inputs = [n for n in source.graph.nodes if n.op == "placeholder"]
    traced_inputs = [n for n in traced.graph.nodes if n.op == "placeholder"]
    writebacks = {}
    for node in traced.graph.nodes:  # the last write-back of each input
        if node.op == "call_function" and node.target is torch.ops.aten.copy_.default:
            writebacks[node.args[0]] = node
    outputs = list(traced_out.args[0])
    for position, value in enumerate(source_out):
        if not isinstance(value, torch.fx.Node) or position >= len(outputs):
            continue
        placeholder = _mutated_input_of(value)
        if placeholder is None:
            continue
        writeback = writebacks.get(traced_inputs[source_inputs.index(placeholder)])
        if writeback is not None:
            outputs[position] = writeback
    traced_out.args = (type(traced_out.args[0])(outputs),)


def _trace_functional(
    gm: torch.fx.GraphModule,
    fake_inputs: list[object],
    lifted: list[LiftedTensor],
    fake_mode: FakeTensorMode,
    decompositions: Decompositions | None,
) -> torch.fx.GraphModule:
    num_user_inputs = len(fake_inputs)

    def run_graph(*flat_inputs: object) -> object:
        tensors = {
            name: value
            for entry, value in zip(lifted, flat_inputs[num_user_inputs:])
            for name in entry.names
        }
        with DeclareHiddenMutations():
            return TracingInterpreter(gm, tensors).run(*flat_inputs[:num_user_inputs])

    tracer = make_fx(
        functionalize(run_graph, remove="mutations"),
        decomposition_table=dict(decompositions or {}),
        tracing_mode="real",
    )
    # preserve_node_meta: the Interpreter publishes each source node's meta, and make_fx copies
    # its stack_trace / nn_module_stack onto the ATen nodes. (make_fx's record_module_stack
    # is not used: it only applies to modules with an `_orig_mod`, as torch.export makes.)
    # The Python dispatcher turns on torch's Python kernels for tracing, e.g. the one that
    # rewrites aten.native_batch_norm (whose schema hides its running-stat updates) into
    # _native_batch_norm_legit, which functionalization can make functional.
    try:
        with (
            fx_traceback.preserve_node_meta(),
            enable_python_dispatcher(),
            fake_mode,
            torch.no_grad(),
        ):
            return tracer(*fake_inputs, *(entry.fake for entry in lifted))
    except TraceError:
        raise
    except Exception as error:
        raise TraceError(
            "kiln.autograd_trace: tracing failed outside any graph node (while functionalizing "
            f"inputs or outputs): {type(error).__name__}: {error}"
        ) from error


def _has_internal_mutation(graph: torch.fx.Graph) -> bool:
    """A mutating op other than an input write-back is left: some CompositeImplicitAutograd
    kernels (``aten._pad_circular``: copies into slices of an empty tensor) run below
    functionalization when traced whole."""
    return any(
        node.op == "call_function"
        and is_op_overload(node.target)
        and is_mutating(node.target)
        and not is_input_writeback(node)
        for node in graph.nodes
    )


def _refunctionalize(
    traced: torch.fx.GraphModule, flat_inputs: list[object], fake_mode: FakeTensorMode
) -> torch.fx.GraphModule:
    """Functionalize ``traced`` once more: its ops are now primitive ATen ops (slice, copy_),
    which functionalization rewrites (slice_scatter); input write-backs come out again."""

    def rerun(*flat: object) -> object:
        return torch.fx.Interpreter(traced).run(*flat)

    tracer = make_fx(functionalize(rerun, remove="mutations"), tracing_mode="real")
    # The python dispatcher, as in the first trace: under symbolic sizes, meta functions call
    # ops (expand) whose C++ kernels reject SymInts.
    with fx_traceback.preserve_node_meta(), enable_python_dispatcher(), fake_mode, torch.no_grad():
        result = tracer(*flat_inputs)
    log.debug("functionalized a second time: mutations were left after the first trace")
    return result


def _rename_placeholders(
    graph: torch.fx.Graph, originals: list[torch.fx.Node], fake_inputs: list[object]
) -> None:
    """Give the traced placeholders the input graph's names (``arg0_1`` -> ``l_x_``).

    Also sets ``meta["val"]`` on placeholders of plain int/float/bool inputs, which make_fx
    leaves without one (their value is baked into the graph).
    """
    traced = [node for node in graph.nodes if node.op == "placeholder"]
    for node, original, value in zip(traced, originals, fake_inputs, strict=True):
        node.meta.setdefault(VAL, value)
        rename = getattr(node, "_rename", None)
        if rename is not None:
            rename(original.name)
            node.target = node.name
