"""Input mutations stored by the kernel that computes the new value, not copied after the graph.

A graph that mutates one of its inputs (a batch norm's running statistics, `x.add_(1)`) ends
with a write-back ``copy_(input, new_value)`` (autograd_trace's functional graphs: inference
graphs have them; a training forward gets them from `append_writebacks`). The partitioner keeps
each ``copy_`` outside the regions, where it runs as an eager ATen call: one more kernel launch
on a GPU. Here each write-back whose new value is an output of one region becomes a request to
that region's lowering (`loopir.LowerOptions.input_writes`): where loopir finds it safe, the
kernel computing the value stores it into the input's memory and the region returns the input
itself, and the ``copy_`` is dropped; otherwise the ``copy_`` stays, as before.

A write-back is requested only where nothing else in the graph could see the input change early:
the input is read only by that region (and the ``copy_``), the new value only by the ``copy_``,
with the same dtype, device and sizes. loopir checks the rest (module docstring of its
`input_stores.py`).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence

import torch
import torch.fx as fx

aten = torch.ops.aten
WRITES_KEY = "kiln_input_writes"  # region GraphModule meta: ((output position, input position), ...)


@dataclasses.dataclass(frozen=True)
class Writeback:
    """A ``copy_`` node writing output `output` of region `region` into input `input` of it."""

    copy: fx.Node
    region: str
    output: int
    input: int


def request_input_writes(parted: fx.GraphModule) -> list[Writeback]:
    """Find the write-backs of `parted` (a partitioned graph) a region may store itself, and ask
    each region for them (``region.meta[WRITES_KEY]``; an input the region did not read becomes
    one more of its placeholders). Returns them."""
    found = []
    for node in list(parted.graph.nodes):
        writeback = _writeback(parted, node)
        if writeback is not None:
            found.append(writeback)
    for writeback in found:
        region = parted.get_submodule(writeback.region)
        region.meta[WRITES_KEY] = (*region.meta.get(WRITES_KEY, ()), (writeback.output, writeback.input))
    return found


def _writeback(parted: fx.GraphModule, node: fx.Node) -> Writeback | None:
    if node.op != "call_function" or node.target is not aten.copy_.default or len(node.args) != 2 or node.kwargs:
        return None
    target, value = node.args
    if not isinstance(target, fx.Node) or target.op != "placeholder" or not isinstance(value, fx.Node):
        return None
    call, position = _region_output(value)
    if call is None or set(value.users) != {node} or not set(target.users) <= {node, call} \
            or not _same_tensor_kind(target, value):
        return None
    region = parted.get_submodule(call.target)
    if not isinstance(region, fx.GraphModule) or list(call.args).count(target) > 1 or call.kwargs:
        return None
    if target not in call.args:
        _add_region_input(region, call, target)
    return Writeback(node, call.target, position, list(call.args).index(target))


def request_donations(parted: fx.GraphModule) -> int:
    """Ask each region to store an output into the memory of an input that dies there: a value
    computed in this graph by an ATen call outside the regions (a convolution, say) that returns
    a tensor of its own (no view, no alias), read by that region alone, with the output's dtype,
    device and sizes. Where loopir finds it safe (`input_stores.py`: only the storing node reads
    that input, each element at the index it stores), the kernel writes its result over the dead
    value, as Inductor reuses such buffers: no new output allocated, the values still in cache
    (channels-last conv + batch norm + relu on a CPU: the batch norm and ReLU in place). Returns
    how many were asked."""
    asked = 0
    for call in parted.graph.nodes:
        if call.op != "call_module" or call.kwargs:
            continue
        region = parted.get_submodule(call.target)
        if not isinstance(region, fx.GraphModule):
            continue
        outputs = _region_outputs(call)
        requested = list(region.meta.get(WRITES_KEY, ()))
        taken_outputs, taken_inputs = {o for o, _ in requested}, {i for _, i in requested}
        for position, value in enumerate(call.args):
            if position in taken_inputs or not _dies_here(value, call):
                continue
            for out_pos, out in outputs.items():
                if out_pos not in taken_outputs and _same_tensor_kind(value, out) and _same_strides(value, out):
                    requested.append((out_pos, position))
                    taken_outputs.add(out_pos)
                    taken_inputs.add(position)
                    asked += 1
                    break
        if requested:
            region.meta[WRITES_KEY] = tuple(requested)
    return asked


def _dies_here(value: object, call: fx.Node) -> bool:
    """`value` is a fresh tensor an ATen call outside the regions made, read by `call` alone, once."""
    if not isinstance(value, fx.Node) or value.op != "call_function" or set(value.users) != {call}:
        return False
    if list(call.args).count(value) != 1:
        return False
    target = value.target
    if not isinstance(target, torch._ops.OpOverload) or target.is_view or target in _SHARES_STORAGE:
        return False
    schema = target._schema
    return (not schema.is_mutable and len(schema.returns) == 1 and schema.returns[0].alias_info is None
            and isinstance(value.meta.get("val"), torch.Tensor))


# Ops whose result shares its input's memory although their schemas say nothing of it.
_SHARES_STORAGE = frozenset(op for op in (getattr(aten, "_unsafe_view", None), getattr(aten, "lift", None))
                            for op in ((op.default,) if op is not None else ()))


def _region_outputs(call: fx.Node) -> dict[int, fx.Node]:
    """The region's outputs the graph reads, by position (a call whose single output is read whole: position 0)."""
    found = {}
    for user in call.users:
        if user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int):
            found.setdefault(user.args[1], user)
    return found


def _same_strides(a: fx.Node, b: fx.Node) -> bool:
    x, y = a.meta.get("val"), b.meta.get("val")
    return [str(n) for n in x.stride()] == [str(n) for n in y.stride()]


def _region_output(value: fx.Node) -> tuple[fx.Node | None, int]:
    """(the region call, output position) that `value` is, or (None, 0)."""
    if value.op == "call_module":
        return value, 0
    if value.op == "call_function" and value.target is operator.getitem and isinstance(value.args[0], fx.Node) \
            and value.args[0].op == "call_module" and isinstance(value.args[1], int):
        return value.args[0], value.args[1]
    return None, 0


def _same_tensor_kind(target: fx.Node, value: fx.Node) -> bool:
    a, b = target.meta.get("val"), value.meta.get("val")
    # sizes compared as text: comparing SymInts would add shape guards
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
            and a.device == b.device and [str(n) for n in a.shape] == [str(n) for n in b.shape])


def _add_region_input(region: fx.GraphModule, call: fx.Node, target: fx.Node) -> None:
    """`target` as one more (last) placeholder of `region`, passed by `call`: a value the region
    does not read, whose memory its kernel writes."""
    placeholders = [n for n in region.graph.nodes if n.op == "placeholder"]
    anchor = placeholders[-1] if placeholders else next(iter(region.graph.nodes))
    insert = region.graph.inserting_after(anchor) if placeholders else region.graph.inserting_before(anchor)
    with insert:
        added = region.graph.placeholder(f"written_{target.name}")
    added.meta = dict(target.meta)
    region.recompile()
    call.args = (*call.args, target)


def drop_stored_writebacks(parted: fx.GraphModule, writebacks: Sequence[Writeback],
                           stored: dict[str, dict[int, int]]) -> int:
    """Erase each write-back whose region stored the value itself (`stored`: by region name,
    loopir's `stored_positions`); its users read the region's output, which is the input.
    Returns how many were erased."""
    erased = 0
    for writeback in writebacks:
        if stored.get(writeback.region, {}).get(writeback.output) != writeback.input:
            continue
        copy = writeback.copy
        copy.replace_all_uses_with(copy.args[1])
        parted.graph.erase_node(copy)
        erased += 1
    if erased:
        parted.graph.lint()
        parted.recompile()
    return erased


def append_writebacks(aten_graph: fx.GraphModule, mutations: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """A training forward's mutated inputs written back inside it: for each ``(output position,
    input position)`` of `mutations` (autograd_trace's ``meta["input_mutations"]``: the output is
    the input's new value), a trailing ``copy_`` into the input, returned at that position (it
    returns the input itself). Returns the output positions, which the compiled forward then
    lists as ``inputs_written`` (autograd_trace's runtime copies nothing for them). Edits
    `aten_graph` in place (the caller passes a copy: autograd_trace keeps its graphs)."""
    graph = aten_graph.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = graph.output_node()
    values = list(output.args[0])
    for out_pos, in_pos in mutations:
        target, value = placeholders[in_pos], values[out_pos]
        with graph.inserting_before(output):
            copy = graph.call_function(aten.copy_.default, (target, value))
        copy.meta = {"val": target.meta.get("val")}
        values[out_pos] = copy
    output.args = (type(output.args[0])(values),)
    graph.lint()
    aten_graph.recompile()
    return tuple(out_pos for out_pos, _ in mutations)
