"""Independent reductions of a kernel that one loop can compute: which nodes share a loop.

`x.sum(-1), x.amax(-1)`, a mean with a sum of squares, a layer norm backward's `sum(g * xhat)`
and `sum(g)`: each reduction alone is a loop over its rows, so the rows are read once per
reduction. Nodes that reduce over the same ranges at the same place (`Kernel.placement`) share
one loop when none of them reads a buffer made since the first of them (a softmax's sum of
`exp(x - max)` reads the max: it keeps a loop of its own, after the max's). A codegen emits each
node's body after the ones before it in that loop (what they load or compute alike once, through
its CSE) and the later nodes' folds and stores after the loop: no node between them in the
kernel reads them (kernel order is topological). Bodies with indirect indexing keep loops of
their own (their range checks are statements each node emits for itself).

Both of kiln's codegens use it (codegen_triton since session 23, codegen_cpp since session 24);
a codegen with further constraints adds them to the key (codegen_cpp's scalar loops keep
reductions with and without OpenMP clauses apart). Measured: an H200's layer norm weight and bias
gradients (split over rows) 10-15% faster with the gradient read once (BENCHMARKS.md session 23);
a 2-thread AVX2 CPU's sum+amax over 2048x1024 0.94x -> 1.05x Inductor (session 24).
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir import ComputedBuffer, Kernel, Reduction, Scan


def _joinable(kernel: Kernel, node: ComputedBuffer) -> bool:
    """A reduction loop of its own (not a row node, scan or scatter) without indirect indexing."""
    body = node.body
    return (isinstance(body, Reduction) and not isinstance(body, Scan) and not kernel.is_row(node)
            and not any(instr.op == "indirect_indexing" for instr in body.loop_body.instrs))


def shared_reduction_loops(kernel: Kernel, key: Callable[[ComputedBuffer], tuple] | None = None
                           ) -> dict[str, tuple[ComputedBuffer, ...]]:
    """Each loop over reduction ranges the kernel runs, keyed by its first node's name: the
    nodes that reduce in it, in kernel order (one node where nothing joins it). A node joins the
    first loop with its key (reduction ranges, placement, and `key(node)` where given) that
    began after every buffer it reads was made."""
    order = {node.name: position for position, node in enumerate(kernel.nodes)}
    loops: dict[str, tuple[tuple, list[ComputedBuffer]]] = {}  # first node -> (key, nodes)
    for node in kernel.nodes:
        if not _joinable(kernel, node):
            continue
        node_key = (tuple(node.reduction_ranges), kernel.placement(node), *(key(node) if key else ()))
        last_read = max((order.get(access.buffer, -1) for access in kernel.accesses(node).reads), default=-1)
        first = next((name for name, (other, _) in loops.items() if other == node_key and order[name] > last_read),
                     node.name)
        loops.setdefault(first, (node_key, []))[1].append(node)
    return {first: tuple(nodes) for first, (_, nodes) in loops.items()}
