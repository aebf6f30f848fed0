"""ATen matmuls outside the regions write into the codegen's output storages.

A compiled CPU graph runs its matmuls as ATen calls between kiln's kernels. Each call allocates
its output afresh, and a block of 128 KiB or more is what glibc may map anew (or grow its heap
for) and give back when it is freed: the next call then faults in every page of it again, inside
the matmul (`mkl_blas_def_sgemm_mscale` first-touching its output). How often that happens
depends on what else the process allocates between calls (eager code, another model), not on
the graph. Measured on the 2-core VM (BENCHMARKS.md, session 16; `perf record -e page-faults`):
Llama 4L d256 timed in turns with Inductor took 600-2600 page faults per kiln call, a third of
them in the matmuls' output writes; alone, none.

A codegen that keeps its own outputs resident (`Codegen.allocate_output`: codegen_cpp's pool)
then also hands out these: each ``mm`` / ``bmm`` / ``addmm`` / ``baddbmm`` node becomes a call of
`matmul_into`, which runs the op's ``out=`` overload on a tensor from that allocator when the
output (contiguous, as ATen's own) is at least `MIN_BYTES`, and the plain op otherwise. The
sizes are read from the operands on each call, so graphs with dynamic shapes keep working. The
pool reuses a storage only once nothing else holds it, so a result the graph keeps (an output,
a saved activation) is never written over.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from kiln import loopir

from . import codegen_registry

aten = torch.ops.aten

# glibc's default mmap threshold: smaller blocks come and go through malloc's bins and stay resident.
MIN_BYTES = 128 << 10


def _mm_size(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    return (a.shape[0], b.shape[1])


def _bmm_size(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    return (a.shape[0], a.shape[1], b.shape[2])


# op -> (its out= overload, the positions of its two matrix operands, the output's sizes from them)
_MATMULS = {aten.mm.default: (aten.mm.out, 0, _mm_size), aten.bmm.default: (aten.bmm.out, 0, _bmm_size),
            aten.addmm.default: (aten.addmm.out, 1, _mm_size), aten.baddbmm.default: (aten.baddbmm.out, 1, _bmm_size)}


_ALLOCATORS: dict[str, Callable[[Any, Any, torch.dtype], torch.Tensor]] = {}


def matmul_into(op: Any, codegen: str, *args: Any, **kwargs: Any) -> Any:
    """``op(*args, **kwargs)`` (an ATen matmul of `_MATMULS`), written into a contiguous tensor
    from the `allocate_output` of the codegen named `codegen` when its output is at least
    `MIN_BYTES`. (The codegen goes by name: a graph's code cannot name a function argument, and
    a graph loaded from the whole-graph cache finds the allocator in the registry.)"""
    allocate = _ALLOCATORS.get(codegen)
    if allocate is None:
        allocate = _ALLOCATORS[codegen] = codegen_registry.registered()[codegen].allocate_output
    out_op, first, size_of = _MATMULS[op]
    a = args[first]
    size = size_of(a, args[first + 1])
    if math.prod(size) * a.element_size() < MIN_BYTES:
        return op(*args, **kwargs)
    stride = tuple(math.prod(size[d + 1:]) for d in range(len(size)))
    return out_op(*args, **kwargs, out=allocate(size, stride, a.dtype))


def pool_matmul_outputs(gm: fx.GraphModule, codegen: loopir.Codegen) -> int:
    """Route `gm`'s ATen matmuls through `matmul_into` when `codegen` has an `allocate_output`;
    returns how many."""
    if codegen.allocate_output is None:
        return 0
    _ALLOCATORS[codegen.name] = codegen.allocate_output
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _MATMULS:
            node.args = (node.target, codegen.name, *node.args)
            node.target = matmul_into
            changed += 1
    if changed:
        gm.recompile()
    return changed
