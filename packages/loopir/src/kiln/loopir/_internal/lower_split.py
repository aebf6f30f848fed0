"""Split reductions: a long reduction into few outputs, run in two stages.

A sum over dim 0 of a (65536, 1024) tensor has 1024 outputs. A GPU codegen gives each program
a block of outputs, so the whole reduction runs on a few dozen programs, each walking 65536
rows: most of the GPU idles (a sum over dim 0 reached 15-65% of copy bandwidth on an H100,
against Inductor's 72-88%). Split, the same sum becomes

    partial[s, c] = sum(x[s * chunk + r, c] for r in range(chunk))     # split x 1024 outputs
    out[c]        = sum(partial[s, c] for s in range(split))

The first stage has `split` times the outputs, each a `chunk`-long reduction (the reduced dims,
merged in order, are cut into `split` equal chunks: the first dims whole and equal parts of the
next, `split_digits`, so no element needs a mask); the second is short. Only sum, prod, max and
min split (their partials combine with the same reduction); partials of bfloat16/float16 values
stay float32, as the one-stage reduction's accumulator does. Sizes must be static.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from .ir import Reduction
from .lower_pointwise import broadcast_load
from .sizes import Expr, FloorDiv, unflatten

SPLIT_TYPES = ("sum", "prod", "max", "min")
MIN_ELEMENTS = 1 << 18  # smaller reductions are cheap whatever their shape
MIN_CHUNK = 512  # elements each partial reduces, at least
# elements one program of the unsplit reduction reduces, at least, for a split to pay for its
# second kernel: an attention mask's `any` over 512 rows of 4096 outputs (32 outputs a program,
# 16384 elements) took 2.4 us in one kernel, 2.3 + 1.2 us split in 4 (H200, session 21)
MIN_PROGRAM_ELEMENTS = 1 << 16
# rows each partial of a reduction over outer dims reduces, at least: a layer norm's weight
# gradient over 4096 rows of 768 in 32 chunks, not 8 of 512 rows (H200, session 20: 96 ->
# 384 programs, 95.9 -> 34.7 us for its weight and bias gradients' partial sums)
MIN_STRIDED_CHUNK = 128
TARGET_PROGRAMS = 1024  # about 8 programs per SM of an H100 / H200
# A split over outer dims of 4-byte (or wider) values aims at four times as many: the strided
# partial kernels of a layer norm's weight gradients (8 warps a program) filled 0.73 of an H200's
# program slots with 768 programs and 0.97 with 3072: (32, 512, 768) 69.6 -> 58.7 us, (4096,
# 3072) 67.6 -> 57.2 (Inductor 56.4 / 57.2), float32 sums over dim 0 the same or 1-3% faster.
# bfloat16 sums over long columns lost with it ((65536, 1024) 44.2 -> 53.9 us, (16384, 3072)
# 34.9 -> 41.6), so 2-byte values keep TARGET_PROGRAMS (H200, session 22, `.devtmp/tp22.py`).
WIDE_STRIDED_TARGET_PROGRAMS = 4096
STRIDED_OUTPUTS_PER_PROGRAM = 32  # a reduction over outer dims gives each program a block of outputs


def split_factor(out_numel: Expr, reduced_sizes: Sequence[Expr], reduces_last_dim: bool,
                 strided_chunk: int = MIN_STRIDED_CHUNK, program_elements: int | None = None,
                 item_bytes: int = 0) -> int:
    """Into how many chunks to cut the reduced dims (1: no split; see `split_digits`).

    A reduction over the last dim gives each program about one output, a reduction over outer
    dims a block of `STRIDED_OUTPUTS_PER_PROGRAM` (so it reads whole runs of the contiguous
    dim); a reduction whose programs each reduce fewer than `MIN_PROGRAM_ELEMENTS` is not
    split (its second kernel would cost more than the split saves; scans, whose chunks each
    cost a pass more, pass their own `program_elements`); the split brings the programs up to
    `TARGET_PROGRAMS` (`WIDE_STRIDED_TARGET_PROGRAMS` over outer dims of values of `item_bytes`
    >= 4; 0: not known, scans), keeping chunks of at least `MIN_CHUNK` elements (`strided_chunk` rows
    over outer dims), with a split that cuts the reduced dims, merged in order, into equal
    chunks without dividing an element's index."""
    sizes = [sympy.sympify(s) for s in (out_numel, *reduced_sizes)]
    if not reduced_sizes or not all(s.is_Integer for s in sizes):
        return 1
    outputs, dims = int(sizes[0]), [int(s) for s in sizes[1:]]
    rnumel = math.prod(dims)
    if outputs * rnumel < MIN_ELEMENTS or outputs == 0:
        return 1
    per_program = 1 if reduces_last_dim else min(outputs, STRIDED_OUTPUTS_PER_PROGRAM)
    if rnumel * per_program < (MIN_PROGRAM_ELEMENTS if program_elements is None else program_elements):
        return 1
    programs = -(-outputs // per_program)
    target = WIDE_STRIDED_TARGET_PROGRAMS if not reduces_last_dim and item_bytes >= 4 else TARGET_PROGRAMS
    most = min(-(-target // programs), rnumel // (MIN_CHUNK if reduces_last_dim else strided_chunk))
    return next((s for s in range(most, 1, -1) if split_digits(dims, s) is not None), 1)


def split_digits(reduced_sizes: Sequence[int], split: int) -> tuple[int, int] | None:
    """(j, q) when `split` chunks of the reduced dims, merged in order, are the first `j` dims
    whole times `q` equal parts of dim `j` (a layer norm's `[8, 512]` rows in 32 chunks: the
    8 of dim 0 times 4 parts of dim 1); None when no such cut exists."""
    lead = 1
    for j, size in enumerate(reduced_sizes):
        if split % lead == 0 and size % (split // lead) == 0:
            return j, split // lead
        lead *= int(size)
        if lead > split:
            return None
    return None


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
    dims = [int(s) for s in reduced_sizes]
    j, parts = split_digits(dims, split)
    chunk = sympy.Integer(dims[j] // parts)
    lead_sizes = tuple(sympy.Integer(d) for d in dims[:j])

    def partial_fn(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        # chunk c: dims before j at c // parts (unflattened), dim j at (c % parts) * chunk + r
        lead = unflatten(FloorDiv(index[0], parts), lead_sizes) if j else ()
        cut = (sympy.Mod(index[0], parts) if j else index[0]) * chunk + rindex[0]
        return inner(ops, index[1:], (*lead, cut, *rindex[1:]))

    partial_size = (sympy.Integer(split), *out_size)
    partial = Reduction(partial_size, (chunk, *reduced_sizes[j + 1:]), reduction_type, partial_fn, dtype)
    partials = ctx.add_reduction(partial, partial_size, origin, dtype)

    def combine_fn(ops: Any, index: tuple[Expr, ...], rindex: tuple[Expr, ...]) -> Any:
        return broadcast_load(ops, partials, (rindex[0], *index), dtype)

    combine = Reduction(out_size, (sympy.Integer(split),), reduction_type, combine_fn, dtype)
    return ctx.add_reduction(combine, out_size, origin, store_dtype, like=like)
