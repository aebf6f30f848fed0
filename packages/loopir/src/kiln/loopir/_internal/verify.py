"""`verify(kg)`: the contract of a `KernelGraph`, checked after lowering and by codegens' tests.

A kernel graph is valid when its FX graph lints, every kernel it lists is called exactly once
with its inputs and size symbols, and every kernel is a sound fusion: all nodes share the
outer ranges, each node reads only kernel inputs or buffers computed earlier in the kernel
(at the index they were stored at), and every size symbol its bodies use is a parameter.
"""

from __future__ import annotations

import logging
import operator

import sympy

from .ir import Kernel, Pointwise, Reduction, merged_index, outer_index
from .kernel_graph import KernelGraph
from .sizes import free_size_symbols, same_exprs

log = logging.getLogger(__name__)


class KernelGraphError(ValueError):
    """A kernel graph breaks loopir's contract; the message names the node or kernel."""


def verify(kg: KernelGraph) -> None:
    """Check `kg`'s contract; raises `ValueError` naming the offending node or kernel."""
    kg.gm.graph.lint()
    listed = {k.name: k for k in kg.kernels}
    calls: dict[str, int] = {}
    for node in kg.gm.graph.nodes:
        if not isinstance(node.target, Kernel):
            continue
        kernel = node.target
        if listed.get(kernel.name) is not kernel:
            raise KernelGraphError(f"node {node.name} calls {kernel.name}, which the KernelGraph does not list")
        expected = len(kernel.inputs) + len(kernel.symbols)
        if len(node.args) != expected or node.kwargs:
            raise KernelGraphError(f"node {node.name} passes {len(node.args)} args to {kernel.name}, which "
                                   f"takes {len(kernel.inputs)} tensors and {len(kernel.symbols)} sizes")
        for user in node.users:
            if user.target is not operator.getitem or not 0 <= user.args[1] < len(kernel.outputs):
                raise KernelGraphError(f"node {user.name} uses the result of {kernel.name}, which is a tuple of "
                                       f"{len(kernel.outputs)} outputs, other than by getitem of one of them")
        calls[kernel.name] = calls.get(kernel.name, 0) + 1
    for kernel in kg.kernels:
        if calls.get(kernel.name) != 1:
            raise KernelGraphError(f"{kernel.name} is called {calls.get(kernel.name, 0)} times in the graph, "
                                   "expected once")
        verify_kernel(kernel)
    log.debug("verified %d kernels", len(kg.kernels))


def verify_kernel(kernel: Kernel) -> None:
    """Check one fused kernel (see the module docstring)."""
    if not kernel.nodes:
        raise KernelGraphError(f"{kernel.name} has no nodes")
    if not kernel.outputs:
        raise KernelGraphError(f"{kernel.name} computes nothing used outside it")
    names = [n.name for n in kernel.nodes]
    for out in kernel.outputs:
        if out.name not in names:
            raise KernelGraphError(f"{kernel.name} lists output {out.name}, which none of its nodes computes")
    inputs = {i.name for i in kernel.inputs}
    stored: dict[str, sympy.Expr] = {}
    exprs: list[sympy.Expr] = []
    for node in kernel.nodes:
        row = kernel.is_row(node)
        merged = (merged_index(node.ranges, kernel.ranges) if isinstance(node.body, Pointwise) else
                  outer_index(node.ranges, kernel.ranges) if isinstance(node.body, Reduction) else None) is not None
        if not row and not merged and not same_exprs(node.ranges, kernel.ranges):
            raise KernelGraphError(f"{kernel.name}: {node.name} iterates {list(node.ranges)}, kernel iterates "
                                   f"{list(kernel.ranges)} (rows: {list(kernel.row_ranges)})")
        rw = kernel.accesses(node)
        for access in rw.reads:
            _check_read(kernel, node.name, access, inputs, stored)
        if [w.buffer for w in rw.writes] != [node.name]:
            raise KernelGraphError(f"{kernel.name}: {node.name} writes {[w.buffer for w in rw.writes]}, "
                                   f"expected exactly one store to {node.name}")
        stored[node.name] = rw.writes[0].index
        exprs += [a.index for a in rw.accesses] + rw.index_exprs + list(node.ranges) + list(node.reduction_ranges)
    missing = free_size_symbols(exprs) - set(kernel.symbols)
    if missing:
        raise KernelGraphError(f"{kernel.name} uses size symbols {sorted(map(str, missing))} "
                               f"that are not among its parameters {list(kernel.symbols)}")


def _check_read(kernel: Kernel, node_name: str, access, inputs: set[str], stored: dict) -> None:
    if access.buffer in stored:
        if sympy.expand(access.index - stored[access.buffer]) != 0:
            raise KernelGraphError(f"{kernel.name}: {node_name} reads {access.buffer} at {access.index}, "
                                   f"not where it was stored ({stored[access.buffer]})")
    elif access.buffer not in inputs:
        raise KernelGraphError(f"{kernel.name}: {node_name} reads {access.buffer}, which is neither an input "
                               "of the kernel nor computed earlier in it")
