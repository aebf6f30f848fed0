"""Graph inputs the graph mutates, written by the kernel that computes their new value.

A caller that copies an output of the graph into one of its inputs afterwards (a batch norm's
running statistics, `x.add_(1)`: functionalization's trailing ``copy_`` write-backs) may ask
`lower` to store that output straight into the input's memory (`LowerOptions.input_writes`),
as Inductor does: one kernel store instead of a store and a copy (on a GPU, a launch fewer).
The kernel then lists ``(output, input)`` in `Kernel.stored_inputs`, its runtime passes the
input tensor as that output's storage, and the kernel graph returns the input itself at that
output's position (`graph_runtime.stored_inputs`, which copies back where a runtime or a layout
copy did not write the input itself). `stored_positions(kg)` tells the caller which writes were
made, so it drops their copies; the others stay the caller's copies, as before.

A write is made only where it is safe, else left to the caller:
- the output is a buffer of a kernel's `Pointwise` or `Reduction` node (not an input passed
  through, an extern's result, a scan or a scatter), of the input's dtype, sizes and strides
  (or a dense buffer in its own dim order that the output reads with the input's layout: each
  element lands where the input holds it; then no later kernel may read that buffer);
- no other output views that buffer or the input, and no other write targets the input;
- no kernel or extern after that kernel reads the input (they would read the old value);
- inside that kernel only that node reads the input, and only at the index it stores (each
  element is read before it is overwritten, by the same thread: the kernel's pointers are
  declared non-aliasing, which holds for every element some load could still see).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence

import sympy
import torch.fx as fx

from .graph_runtime import stored_inputs
from .ir import BufferSpec, ComputedBuffer, Kernel, Pointwise, Reduction, Scatter
from .lower import LoweredGraph
from .schedule import Schedule
from .sizes import contiguous_strides, numel, same_exprs
from .values import StridedView

STORED_INPUTS = "stored_inputs"  # kernel graph gm.meta key: {output position: input position} written


def input_specs(lowered: LoweredGraph) -> list[BufferSpec | None]:
    """The spec of each placeholder of the lowered graph, by position (None: not a tensor)."""
    return [g.spec for g in lowered.inputs if g.kind == "placeholder"]


def plan_input_stores(lowered: LoweredGraph, plan: Schedule, writes: Sequence[tuple[int, int]]
                      ) -> tuple[Schedule, dict[int, int]]:
    """`plan` with each write ``(output position, input position)`` that is safe (module
    docstring) made by the kernel computing the output; returns it and the writes made."""
    if lowered.output_spec is not None or not writes:
        return plan, {}
    specs = input_specs(lowered)
    targets = [in_pos for _, in_pos in writes]
    items = list(plan.items)
    made: dict[int, int] = {}
    for out_pos, in_pos in writes:
        target = specs[in_pos] if 0 <= in_pos < len(specs) else None
        if target is None or targets.count(in_pos) != 1 or not 0 <= out_pos < len(lowered.outputs):
            continue
        found = _writing_kernel(lowered, items, out_pos, target)
        if found is None:
            continue
        position, node = found
        kernel = items[position]
        inputs = kernel.inputs if any(i.name == target.name for i in kernel.inputs) else (*kernel.inputs, target)
        items[position] = dataclasses.replace(kernel, inputs=inputs,
                                              stored_inputs=(*kernel.stored_inputs, (node.name, target.name)))
        made[out_pos] = in_pos
    return dataclasses.replace(plan, items=tuple(items)), made


def _writing_kernel(lowered: LoweredGraph, items: list, out_pos: int, target: BufferSpec
                    ) -> tuple[int, ComputedBuffer] | None:
    """(position in `items`, node) of the kernel node that may store output `out_pos` into
    `target`, or None where that is not safe (module docstring)."""
    value = lowered.outputs[out_pos]
    if not isinstance(value, StridedView) or value.dtype != target.dtype or not _same_layout(value, target) \
            or sympy.sympify(value.offset) != 0:
        return None
    for pos, other in enumerate(lowered.outputs):
        if pos != out_pos and isinstance(other, StridedView) and other.buffer in (value.buffer, target.name):
            return None
    position = next((p for p, item in enumerate(items) if isinstance(item, Kernel)
                     and any(o.name == value.buffer for o in item.outputs)), None)
    if position is None:
        return None
    kernel = items[position]
    node = next(n for n in kernel.nodes if n.name == value.buffer)
    if type(node.body) not in (Pointwise, Reduction) or not _stores_as(node.spec, value, target):
        return None
    if any(target.name in _reads(item) for item in items[position + 1:]):
        return None
    if not _same_layout(node.spec, target) and any(value.buffer in _reads(item) for item in items[position + 1:]):
        return None  # later kernels would get the input's shape where they read the buffer's
    return (position, node) if _reads_only_where_stored(kernel, node, target.name) else None


# Externs whose result is always a new tensor of their own (never a view of an argument).
_FRESH_RESULT_OPS = ("mm", "addmm", "bmm", "baddbmm", "convolution")


def plan_extern_output_reuse(lowered: LoweredGraph, plan: Schedule, pointwise: bool = True,
                             scatters: bool = False) -> Schedule:
    """`plan` with each pointwise kernel node (`pointwise`; `LowerOptions.reuse_extern_outputs`)
    that may store its value into the memory of a dead result it reads doing so
    (`Kernel.stored_inputs`): an extern's output, or an earlier kernel's. With `scatters`
    (`LowerOptions.scatter_into_dead_bases`), likewise each scatter whose base is such a dead
    result: it scatters into the base's memory instead of a copy of it (an embedding's gradient:
    a zero fill, then the scatter, not a fill, a copy and the scatter).

    Safe where: the result is a matmul's or convolution's (a new tensor, no view of anything), or
    an earlier kernel's output stored in memory of its own (not itself written into an input's);
    no graph output views that result; no kernel or extern after this kernel reads it; the node's
    buffer has its dtype, sizes and strides; inside the kernel only the node reads it, and only at
    the index it stores (each element is read before it is overwritten, by the same thread); no
    other store targets it. The result is then dead once the node has read it, and the node's
    buffer is that memory (a runtime that allocates anyway stays correct)."""
    escaping = {o.buffer for o in lowered.outputs if isinstance(o, StridedView)}
    items = list(plan.items)
    last_read = {name: position for position, item in enumerate(items) for name in _reads(item)}
    fresh: set[str] = set()
    for position, item in enumerate(items):
        if not isinstance(item, Kernel):
            if not item.items and item.op.overloadpacket.__name__ in _FRESH_RESULT_OPS:
                fresh.add(item.spec.name)
            continue
        candidates = [spec for spec in item.inputs if spec.name in fresh and spec.name not in escaping
                      and last_read[spec.name] == position]
        if candidates:
            items[position] = item = _store_into_dead_results(item, candidates, pointwise, scatters)
        fresh.update(_fresh_outputs(item))
    return dataclasses.replace(plan, items=tuple(items))


def _store_into_dead_results(item: Kernel, candidates: list[BufferSpec], pointwise: bool = True,
                             scatters: bool = False) -> Kernel:
    """`item` with each pointwise output node (`pointwise`) storing into one of `candidates`
    (dead results it reads) where that is safe (see `plan_extern_output_reuse`), and each
    scatter (`scatters`) into its base where that is one of them."""
    taken = {into for _, into in item.stored_inputs}
    storing = {out for out, _ in item.stored_inputs}
    outputs = {o.name for o in item.outputs}
    for node in item.nodes:
        if node.name not in outputs or node.name in storing:
            continue
        if scatters and isinstance(node.body, Scatter):
            base = next((spec for spec in candidates if spec.name == node.body.base), None)
            if base is not None and base.name not in taken and base.dtype == node.spec.dtype \
                    and _same_layout(node.spec, base) and _reads_only_as_base(item, node, base.name):
                item = dataclasses.replace(item, stored_inputs=(*item.stored_inputs, (node.name, base.name)))
                taken.add(base.name)
            continue
        if not pointwise or type(node.body) is not Pointwise:
            continue
        target = next((spec for spec in candidates if spec.name not in taken
                       and spec.dtype == node.spec.dtype and _same_layout(node.spec, spec)
                       and _reads_only_where_stored(item, node, spec.name)), None)
        if target is not None:
            item = dataclasses.replace(item, stored_inputs=(*item.stored_inputs, (node.name, target.name)))
            taken.add(target.name)
    return item


def _fresh_outputs(kernel: Kernel) -> set[str]:
    """The kernel's outputs stored in memory of their own (not written into an input's)."""
    stored = {out for out, _ in kernel.stored_inputs}
    return {o.name for o in kernel.outputs if o.name not in stored}


def _same_layout(value: StridedView | BufferSpec, target: BufferSpec) -> bool:
    return same_exprs(value.size, target.size) and same_exprs(value.stride, target.stride)


def _stores_as(spec: BufferSpec, value: StridedView, target: BufferSpec) -> bool:
    """Whether the node's buffer (`spec`) puts every element where `target` holds it: the same
    layout, or a dense buffer in its own dim order (a channels-last value computed over
    (N, H, W, C) loops) that the output `value` reads with `target`'s layout from offset 0."""
    if _same_layout(spec, target):
        return True
    return (same_exprs(spec.stride, contiguous_strides(spec.size))
            and sympy.simplify(numel(spec.size) - numel(target.size)) == 0 and _same_layout(value, target))


def _reads(item: object) -> set[str]:
    if isinstance(item, Kernel):
        return {i.name for i in item.inputs}
    return item.reads()


def _reads_only_where_stored(kernel: Kernel, node: ComputedBuffer, name: str) -> bool:
    """Whether `node` is the only node of `kernel` reading buffer `name`, and reads it only at
    the index where it stores its own value."""
    for other in kernel.nodes:
        accesses = kernel.accesses(other).accesses
        loads = [a.index for a in accesses if a.kind == "load" and a.buffer == name]
        if other is not node:
            if loads:
                return False
            continue
        stores = [a.index for a in accesses if a.kind == "store" and a.buffer == node.name]
        if len(stores) != 1 or any(sympy.simplify(index - stores[0]) != 0 for index in loads):
            return False
    return True


def _reads_only_as_base(kernel: Kernel, node: ComputedBuffer, name: str) -> bool:
    """Whether scatter `node` is the only node of `kernel` reading buffer `name` (its base), and
    reads it only as the copy its buffer starts as (not as a source of the scattered values:
    `x.scatter(0, i, x)` reads elements another store may already have changed)."""
    for other in kernel.nodes:
        loads = [a for a in kernel.accesses(other).accesses if a.kind == "load" and a.buffer == name]
        if len(loads) > (1 if other is node else 0):
            return False
    return True


def return_stored_inputs(gm: fx.GraphModule, made: dict[int, int]) -> None:
    """Each output position of `made` returns its input (`stored_inputs`), in place; records
    `made` in ``gm.meta[STORED_INPUTS]``."""
    gm.meta[STORED_INPUTS] = dict(made)
    if not made:
        return
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = graph.output_node()
    flat = output.args[0]
    as_tuple = isinstance(flat, (tuple, list))
    values = list(flat) if as_tuple else [flat]
    positions = sorted(made)
    with graph.inserting_before(output):
        stored = graph.call_function(stored_inputs, (tuple(placeholders[made[p]] for p in positions),
                                                     tuple(values[p] for p in positions)))
        for item, out_pos in enumerate(positions):
            values[out_pos] = graph.call_function(operator.getitem, (stored, item))
    output.args = (tuple(values) if as_tuple else values[0],)
    graph.lint()
    gm.recompile()


def stored_positions(gm: fx.GraphModule) -> dict[int, int]:
    """{output position: input position} of the kernel graph module `gm`'s outputs that are
    inputs it stored their new values into (`LowerOptions.input_writes`)."""
    return dict(gm.meta.get(STORED_INPUTS, {}))

