"""ATen matmuls outside the regions write into the codegen's output storages.

A compiled CPU graph runs its matmuls as ATen calls between kiln's kernels. Each call allocates
its output afresh, and a block of 128 KiB or more is what glibc may map anew (or grow its heap
for) and give back when it is freed: the next call then faults in every page of it again, inside
the matmul (`mkl_blas_def_sgemm_mscale` first-touching its output). How often that happens
depends on what else the process allocates between calls (eager code, another model), not on
the graph. Measured on the 2-core VM (BENCHMARKS.md, session 16): Llama 4L d256 timed in turns
with Inductor took 1200-3300 page faults per kiln call (`perf record -e page-faults`: the largest
share in MKL's first write of a matmul's output), none when it ran alone; with the matmuls'
outputs pooled, about 110.

A codegen that keeps its own outputs resident (`Codegen.allocate_output`: codegen_cpp's pool)
then also hands out these: each ``mm`` / ``bmm`` / ``addmm`` / ``baddbmm`` node becomes a call of
`mm_into` / `bmm_into` / `addmm_into` / `baddbmm_into`, which run the op's ``out=`` overload on a tensor from that allocator when the
output (contiguous, as ATen's own) is at least `MIN_BYTES`, and the plain op otherwise. The
sizes are read from the operands on each call, so graphs with dynamic shapes keep working. The
pool reuses a storage only once nothing else holds it, so a result the graph keeps (an output,
a saved activation) is never written over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from kiln import loopir

from . import codegen_registry

aten = torch.ops.aten

# glibc's default mmap threshold: smaller blocks come and go through malloc's bins and stay resident.
MIN_BYTES = 128 << 10


_ALLOCATORS: dict[str, Callable[[Any, Any, torch.dtype], torch.Tensor]] = {}


def _allocator(codegen: str) -> Callable[[Any, Any, torch.dtype], torch.Tensor]:
    """The `allocate_output` of the codegen named `codegen`. (By name: a graph's code cannot name a
    function argument, and a graph loaded from the whole-graph cache finds it in the registry.)"""
    allocate = _ALLOCATORS.get(codegen)
    if allocate is None:
        allocate = _ALLOCATORS[codegen] = codegen_registry.registered()[codegen].allocate_output
    return allocate


# One function per op: one Python frame per call, as the `OpOverload.__call__` it replaces (the
# sizes computed inline, the op called through torch's C binding, `out=` for a pooled output).
def mm_into(codegen: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.mm(a, b)``, into a pooled output when it is at least `MIN_BYTES`."""
    n, m = a.shape[0], b.shape[1]
    if n * m * a.element_size() < MIN_BYTES:
        return torch.mm(a, b)
    return torch.mm(a, b, out=_allocator(codegen)((n, m), (m, 1), a.dtype))


def addmm_into(codegen: str, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """``aten.addmm(bias, a, b, beta=, alpha=)``, into a pooled output when it is at least `MIN_BYTES`."""
    n, m = a.shape[0], b.shape[1]
    if n * m * a.element_size() < MIN_BYTES:
        return torch.addmm(bias, a, b, **kwargs)
    return torch.addmm(bias, a, b, **kwargs, out=_allocator(codegen)((n, m), (m, 1), a.dtype))


def bmm_into(codegen: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``aten.bmm(a, b)``, into a pooled output when it is at least `MIN_BYTES`."""
    batch, n, m = a.shape[0], a.shape[1], b.shape[2]
    if batch * n * m * a.element_size() < MIN_BYTES:
        return torch.bmm(a, b)
    return torch.bmm(a, b, out=_allocator(codegen)((batch, n, m), (n * m, m, 1), a.dtype))


def baddbmm_into(codegen: str, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """``aten.baddbmm(bias, a, b, beta=, alpha=)``, into a pooled output when it is at least `MIN_BYTES`."""
    batch, n, m = a.shape[0], a.shape[1], b.shape[2]
    if batch * n * m * a.element_size() < MIN_BYTES:
        return torch.baddbmm(bias, a, b, **kwargs)
    return torch.baddbmm(bias, a, b, **kwargs, out=_allocator(codegen)((batch, n, m), (n * m, m, 1), a.dtype))


_MATMULS = {aten.mm.default: mm_into, aten.addmm.default: addmm_into, aten.bmm.default: bmm_into,
            aten.baddbmm.default: baddbmm_into}


# Without a pool, the same ops through torch's C bindings, which take the same arguments (the
# schema's, `beta=` / `alpha=` as keywords) and call the same ATen op: `OpOverload.__call__` is a
# Python frame and a boxed call more (torch.ops.aten.mm.default 2.4 us against torch.mm 1.4 us a
# call on a 2-core CPU host; a GPU step runs a hundred matmuls or more).
_DIRECT = {aten.mm.default: torch.mm, aten.addmm.default: torch.addmm, aten.bmm.default: torch.bmm,
           aten.baddbmm.default: torch.baddbmm}


def pool_matmul_outputs(gm: fx.GraphModule, codegen: loopir.Codegen) -> int:
    """Route `gm`'s ATen matmuls through `mm_into` and the others when `codegen` has an
    `allocate_output`, else straight to torch's C bindings (`_DIRECT`); returns how many."""
    pooled = codegen.allocate_output is not None
    if pooled:
        _ALLOCATORS[codegen.name] = codegen.allocate_output
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _MATMULS:
            if pooled:
                node.args = (codegen.name, *node.args)
            node.target = (_MATMULS if pooled else _DIRECT)[node.target]
            changed += 1
    if changed:
        gm.recompile()
    return changed
