"""Independent reductions over the same rows in one loop: which nodes share a loop.

`x.sum(-1), x.amax(-1)`, a mean with a sum of squares, `min` with `max`: each reduction alone
is a loop over the row, so the row is read once per reduction. Nodes that reduce over the same
ranges at the same place (`Kernel.placement`) share one loop when none of them reads a buffer
made since the first of them (the sum of `exp(x - max)` of a softmax reads the max: it keeps a
loop of its own, after the max's). In the shared loop each accumulator is updated as in its
own loop (`reduction_source.join_reductions`), and what the nodes load or compute alike is
emitted once (the handler's CSE, `CppHandler.loop_cache`). The later nodes' folds and stores
follow the loop: no node between them in the kernel reads them (they come later in the kernel's
order, which is topological).

codegen_triton joins reductions by the same rule (its `kernel_source.shared_reduction_loops`).
"""

from __future__ import annotations

from kiln.loopir import ComputedBuffer, Kernel, Reduction, Scan

from .kernel_source import C_TYPES
from .reduction_source import has_openmp_clauses


def _joinable(kernel: Kernel, node: ComputedBuffer) -> bool:
    """A reduction loop of its own (not a row node, scan or scatter) without indirect indexing
    (its range checks are statements each node emits for itself)."""
    body = node.body
    return (isinstance(body, Reduction) and not isinstance(body, Scan) and not kernel.is_row(node)
            and not any(instr.op == "indirect_indexing" for instr in body.loop_body.instrs))


def _loop_key(kernel: Kernel, node: ComputedBuffer, scalar: bool) -> tuple:
    """What nodes sharing a loop have alike: their reduction ranges and placement (and, in
    scalar code, whether OpenMP clauses combine their accumulators)."""
    key = (tuple(node.reduction_ranges), kernel.placement(node))
    if scalar:
        key += (has_openmp_clauses(node.body.reduction_type, C_TYPES.get(node.body.dtype, "")),)
    return key


def shared_reduction_loops(kernel: Kernel, scalar: bool) -> dict[str, tuple[ComputedBuffer, ...]]:
    """Each loop over reduction ranges the kernel runs, keyed by its first node: the nodes that
    reduce in it, in kernel order (one node where nothing joins it). A node joins the first loop
    with its key that it can: one that began after every buffer it reads was made. `scalar`:
    the loops are scalar code, whose OpenMP reduction clauses (the `simd` of a row, the threads
    of a kernel without outer loop) hold only when every accumulator has one, so reductions
    without (argmax/argmin, a bool max/min) keep loops apart from those with."""
    order = {node.name: position for position, node in enumerate(kernel.nodes)}
    loops: dict[str, tuple[tuple, list[ComputedBuffer]]] = {}  # first node -> (key, nodes)
    for node in filter(lambda node: _joinable(kernel, node), kernel.nodes):
        key = _loop_key(kernel, node, scalar)
        last_read = max((order.get(access.buffer, -1) for access in kernel.accesses(node).reads), default=-1)
        first = next((name for name, (other, _) in loops.items() if other == key and order[name] > last_read),
                     node.name)
        loops.setdefault(first, (key, []))[1].append(node)
    return {first: tuple(nodes) for first, (_, nodes) in loops.items()}
