"""`KernelWalker`: runs one kernel's nodes on a `TextHandler`, a loop at a time.

A kernel's nodes are of four kinds (`kind`): ``"pointwise"`` (straight-line code at each
outer point), ``"reduction"`` (a loop over the node's reduction ranges, then code after it),
``"row"`` (a loopir row node: its own loop over the kernel's row ranges) and ``"scan"`` (a
`Scan`: a loop over its scanned dim whose body stores at every step; the codegen's `scan` op
keeps the running value, declared before the loop; a `Scatter` is a scan whose loop runs
over its source elements and stores with the `scatter` op, after the runtime copied its base
into its buffer: see `scatter_bases`). The walker runs
a node's body where the kernel's scheduler placed it (`Kernel.placement`) and gives each
kind a context manager that collects its statements and closes its scopes, so a codegen only
wraps them in its target's loops:

    walker = KernelWalker(kernel, handler)
    for node, kind in walker.nodes():
        if kind == "row":
            with walker.row_loop(node) as body:
                walker.run(node)
            ...  # wrap `body` in a loop over kernel.row_ranges
        elif kind == "reduction":
            with walker.reduction(node) as parts:
                walker.run(node)
            ...  # parts.body in a loop over node.reduction_ranges, then parts.after
        elif kind == "scan":
            with walker.row_loop(node) as body:
                walker.run(node)
            ...  # the running value's declaration, then `body` in a loop over node.reduction_ranges
        else:
            with walker.pointwise(node) as body:
                walker.run(node)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from ..ir import ComputedBuffer, Kernel, Reduction, Scan, Scatter
from .handler import TextHandler


@dataclasses.dataclass(slots=True)
class ReductionParts:
    """A reduction node's statements: `body` runs once per iteration of its loop, `after`
    once after the loop (the fold, and the store of the result)."""

    body: list[str] = dataclasses.field(default_factory=list)
    after: list[str] = dataclasses.field(default_factory=list)


class KernelWalker:
    """Drives a handler over a kernel's nodes (see the module docstring)."""

    def __init__(self, kernel: Kernel, handler: TextHandler) -> None:
        self.kernel = kernel
        self.handler = handler

    def kind(self, node: ComputedBuffer) -> str:
        if self.kernel.is_row(node):
            return "row"
        if isinstance(node.body, Scan):
            return "scan"
        return "reduction" if isinstance(node.body, Reduction) else "pointwise"

    def nodes(self) -> Iterator[tuple[ComputedBuffer, str]]:
        for node in self.kernel.nodes:
            yield node, self.kind(node)

    def run(self, node: ComputedBuffer) -> None:
        """Emit `node`'s body, store included, at its placement in the kernel."""
        saved = self.handler.node
        self.handler.node = node
        try:
            node.run(self.handler, *self.kernel.placement(node))
        finally:
            self.handler.node = saved

    @contextlib.contextmanager
    def pointwise(self, node: ComputedBuffer) -> Iterator[list[str]]:
        """Straight-line statements at the current outer point; its values stay in scope."""
        with self.handler.capture() as lines:
            yield lines

    @contextlib.contextmanager
    def reduction(self, node: ComputedBuffer) -> Iterator[ReductionParts]:
        """A reduction: the handler's `reduction` op closes the loop body (`end_loop_body`);
        values computed in the loop, and after it, are out of scope for later nodes."""
        parts = ReductionParts()
        with self.handler.scope(), self.handler.capture() as after:
            yield parts
            parts.body = self.handler.loop_body if self.handler.loop_body is not None else []
        parts.after = after

    @contextlib.contextmanager
    def row_loop(self, node: ComputedBuffer) -> Iterator[list[str]]:
        """A row node's loop body. Its values and its stored register are out of scope after
        the loop: later loops read the row from memory (or recompute a row temporary)."""
        with self.handler.scope(keep_locals=False), self.handler.capture() as lines:
            yield lines


def node_summary(node: ComputedBuffer) -> str:
    """``buf3: float32[8, 16], sum over [32] <- add_1, mul``: what a node computes."""
    spec = node.spec
    text = f"{node.name}: {str(spec.dtype).removeprefix('torch.')}[{', '.join(str(s) for s in spec.size)}]"
    if isinstance(node.body, Scatter):
        text += f", scatter ({node.body.mode}) into a copy of {node.body.base}"
    elif isinstance(node.body, Scan):
        text += f", cumulative {node.body.reduction_type} along dim {node.body.scan_dim}"
    elif isinstance(node.body, Reduction):
        text += f", {node.body.reduction_type} over {list(node.body.reduction_ranges)}"
    return text + (f" <- {', '.join(node.origins)}" if node.origins else "")


def scatter_bases(kernel: Kernel) -> tuple[tuple[int, int], ...]:
    """(output position, input position) of each `Scatter` node of `kernel`: a runtime copies
    that input (the node's base) into that output before running the kernel."""
    outputs = [o.name for o in kernel.outputs]
    inputs = [i.name for i in kernel.inputs]
    return tuple((outputs.index(n.name), inputs.index(n.body.base)) for n in kernel.nodes
                 if isinstance(n.body, Scatter) and n.name in outputs)


def input_stores(kernel: Kernel) -> tuple[tuple[int, int], ...]:
    """(output position, input position) of each output `kernel` stores into an input's memory
    (`Kernel.stored_inputs`): a runtime passes that input tensor as the output instead of
    allocating one, and returns it. A runtime that allocates anyway stays correct (slower): the
    kernel graph copies such an output into its input (`graph_runtime.stored_inputs`)."""
    outputs = [o.name for o in kernel.outputs]
    inputs = [i.name for i in kernel.inputs]
    return tuple((outputs.index(out), inputs.index(into)) for out, into in kernel.stored_inputs)
