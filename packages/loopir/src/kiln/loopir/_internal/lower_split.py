"""Split reductions: a long reduction into few outputs, run in two stages.

A sum over dim 0 of a (65536, 1024) tensor has 1024 outputs. A GPU codegen gives each program
a block of outputs, so the whole reduction runs on a few dozen programs, each walking 65536
rows: most of the GPU idles (a sum over dim 0 reached 15-65% of copy bandwidth on an H100,
against Inductor's 72-88%). Split, the same sum becomes

    partial[s, c] = sum(x[s * chunk + r, c] for r in range(chunk))     # split x 1024 outputs
    out[c]        = sum(partial[s, c] for s in range(split))

The first stage has `split` times the outputs, each a `chunk`-long reduction (the first reduced
dim is cut into `split` equal chunks, so indices stay affine and no element needs a mask); the
second is short. Only sum, prod, max and min split (their partials combine with the same
reduction); partials of bfloat16/float16 values stay float32, as the one-stage reduction's
accumulator does. Sizes must be static.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from .ir import Reduction
from .lower_pointwise import broadcast_load
from .sizes import Expr

SPLIT_TYPES = ("sum", "prod", "max", "min")
MIN_ELEMENTS = 1 << 18  # smaller reductions are cheap whatever their shape
MIN_CHUNK = 512  # elements each partial reduces, at least
TARGET_PROGRAMS = 1024  # about 8 programs per SM of an H100 / H200
STRIDED_OUTPUTS_PER_PROGRAM = 32  # a reduction over outer dims gives each program a block of outputs


def split_factor(out_numel: Expr, reduced_sizes: Sequence[Expr], reduces_last_dim: bool) -> int:
    """Into how many chunks to cut the first reduced dim (1: no split).

    A reduction over the last dim gives each program about one output, a reduction over outer
    dims a block of `STRIDED_OUTPUTS_PER_PROGRAM` (so it reads whole runs of the contiguous
    dim); the split brings the programs up to `TARGET_PROGRAMS`, keeping chunks of at least
    `MIN_CHUNK` elements, with a split that divides the first reduced dim exactly."""
    sizes = [sympy.sympify(s) for s in (out_numel, *reduced_sizes)]
    if not reduced_sizes or not all(s.is_Integer for s in sizes):
        return 1
    outputs, first = int(sizes[0]), int(sizes[1])
    rnumel = math.prod(int(s) for s in sizes[1:])
    if outputs * rnumel < MIN_ELEMENTS or outputs == 0:
        return 1
    programs = outputs if reduces_last_dim else max(1, outputs // STRIDED_OUTPUTS_PER_PROGRAM)
    most = min(-(-TARGET_PROGRAMS // programs), rnumel // MIN_CHUNK, first)
    return next((s for s in range(most, 1, -1) if first % s == 0), 1)


def reduces_contiguous_dim(node: Any, reduced: Sequence[int], rank: int) -> bool:
    """Whether a reduction of `node`'s first argument over dims `reduced` walks the dim its
    elements are contiguous along: eager's layout of the argument (its FakeTensor) says which
    dim that is. A channels-last batch's is the channel dim (a batch norm's statistics over N,
    H, W reduce over outer dims, in memory), not the logical last dim."""
    source = node.args[0] if node.args else None
    fake = source.meta.get("val") if hasattr(source, "meta") else None
    if isinstance(fake, torch.Tensor) and fake.dim() == rank:
        # Symbolic sizes or strides are skipped, never compared: an unbacked size (a nonzero's
        # count) cannot be guarded on, and a reduction over symbolic sizes does not split anyway.
        unit = [d for d, (n, st) in enumerate(zip(fake.shape, fake.stride()))
                if type(st) is int and st == 1 and type(n) is int and n != 1]
        if unit:
            return unit[-1] in reduced
    return rank - 1 in reduced


def split_reduction(ctx: Any, origin: str, inner: Callable[..., Any], out_size: Sequence[Expr],
                    reduced_sizes: Sequence[Expr], reduction_type: str, dtype: Any, split: int,
                    store_dtype: Any, like: Any) -> Any:
    """Realize the two stages of a split reduction; returns the second stage's StridedView.

    `inner(ops, index, rindex)` is the one-stage reduction's element function, `dtype` its
    accumulation dtype (the partials' dtype)."""
    out_size = tuple(out_size)
    chunk = sympy.Integer(int(reduced_sizes[0]) // split)

    def partial_fn(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        return inner(ops, index[1:], (index[0] * chunk + rindex[0], *rindex[1:]))

    partial_size = (sympy.Integer(split), *out_size)
    partial = Reduction(partial_size, (chunk, *reduced_sizes[1:]), reduction_type, partial_fn, dtype)
    partials = ctx.add_reduction(partial, partial_size, origin, dtype)

    def combine_fn(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        return broadcast_load(ops, partials, (rindex[0], *index), dtype)

    combine = Reduction(out_size, (sympy.Integer(split),), reduction_type, combine_fn, dtype)
    return ctx.add_reduction(combine, out_size, origin, store_dtype, like=like)
