"""Public entry points: `lower` and `verify` (in `verify.py`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch.fx as fx

from .input_stores import plan_extern_output_reuse, plan_input_stores, return_stored_inputs
from .kernel_graph import KernelGraph, build_kernel_graph
from .lower import LoweringError, lower_graph
from .registry import Lowerings
from .schedule import schedule
from .verify import verify
from .welford import welford_schedule
from .wrapper_passes import fewer_calls, share_private_outputs

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class LowerOptions:
    """Options of `lower`.

    lowerings: the lowering table (None: `default_lowerings()`); a caller adds its own ops with
        ``default_lowerings() | table`` and gives the same table to `supported_ops`, so the
        partitioner sends those ops to loopir.
    fuse_rows: fuse pointwise work over a reduction's rows into the reduction's kernel as row
        nodes (`Kernel.is_row`); a codegen that cannot emit row loops passes False.
    row_temporaries: row nodes that no other kernel reads stay out of their kernel's outputs
        (`Kernel.row_temporaries`), for codegens that keep them themselves (codegen_cpp: a row
        scratch buffer per thread; codegen_triton: recomputed where they are loaded). Without
        it every row node's buffer is a kernel output, written to memory.
    round_low_precision: bfloat16/float16 results are computed in float32 and, by default,
        rounded once, where they are stored (Inductor's semantics: usually closer to a float64
        reference than eager). True rounds each ATen op's low-precision result as eager does,
        for results bit-closer to eager's; reductions accumulate in float32 either way.
    recompute_cheap: a value read by several users is computed again by each user when its
        body is cheap (a couple of loads and a few ops, nothing random or indirect), instead of
        stored once (`recompute.py`): fewer bytes move, more math runs; for
        memory-bound targets (codegen_triton: a bfloat16 -> float32 cast read by a log
        softmax's three loops was a float32 copy written once and read three times).
    recompute_transcendental: with `recompute_cheap`, values with costly math (exp, log, tanh,
        sqrt, pow, ...) are recomputed too; False recomputes arithmetic only
        (`shared/op_costs.ARITHMETIC`): a softmax's exp is computed once and stored, a batch norm's
        centred input is recomputed (codegen_cpp).
    split_reductions: a long sum/prod/max/min into few outputs (a sum over dim 0, a bias
        gradient, a whole-tensor sum) runs as partial reductions over chunks of its first reduced
        dim, then a reduction of the partials (`lower_split.py`): enough programs to keep a GPU
        busy. Partials of low-precision values stay float32. Long cumsum/cumprod/logcumsumexp over
        few rows split the same way (chunk scans, a scan of their totals, a combine: `lower_scan.py`).
    output_views: an output eager returns as a view of a computed value or input whose strides
        no buffer of its own can have (``expand``'s 0, a slice's gaps under dynamic shapes) is a
        view of that value, computed in its eager layout (`output_views.py`). False stores it on
        its own, contiguous, and an output that views a buffer something else reads is a copy:
        for graphs whose outputs leave through an `autograd.Function` (training), where a view
        created inside it cannot be modified in place; a view whose elements overlap (an
        expand's stride 0) stays a view either way (eager modifies none in place). Either way, an output viewing a kernel's
        buffer nothing else reads (one computed in memory order) is no view: a tensor of its own
        over that storage.
    input_writes: ``(output position, input position)`` pairs: that output is the new value of
        that input (placeholder), which the caller copies into it afterwards. Where it is safe
        (`input_stores.py`), the kernel computing it stores it into the input's memory and the
        kernel graph returns the input itself there (`stored_positions(kg.gm)` lists those); the
        others stay the caller's copies.
    private_outputs: output positions no user sees (a training forward's tensors saved for the
        backward): with `output_views` False, one that views a buffer no user-visible output
        shares stays a view rather than a copy (`wrapper_passes.share_private_outputs`).
    welford: a variance's second pass over its values (the sum of squared deviations from
        their mean, beside the sum of the values in the same kernel) becomes a `Welford` node
        over the values themselves (`welford.py`), so both reduce in one pass: for codegens with
        the `welford` capability (codegen_triton, whose long rows are read once, not twice).
    reuse_extern_outputs: a pointwise kernel node may store its value into the memory of a
        matmul's (or convolution's) output, or an earlier kernel's, it reads where nothing after
        the kernel reads that output (`input_stores.plan_extern_output_reuse`), as Inductor's
        wrapper reuses dead buffers: a SiLU * up after two matmuls writes where it reads.
    scatter_into_dead_bases: a scatter whose base (the buffer it starts as a copy of) is a
        matmul's output or an earlier kernel's that nothing after it reads scatters into that
        memory instead of a copy (`input_stores.plan_extern_output_reuse`): an embedding's
        gradient is a zero fill and the scatter, without a copy of the zeros between. For
        codegens whose runtime honours `Kernel.stored_inputs` for scatters (it then skips the
        base copy: the output is the base).
    join_earlier_kernels: a pointwise value or reduction that cannot join the open kernel may
        join an earlier, closed one that holds or loads its inputs (`schedule._earlier_group`):
        values saved for a backward graph late in the forward graph (a norm's input and
        statistics) become outputs of the kernel computing them instead of kernels of their own;
        a split reduction's partial sums over the same rows (a layer norm's weight and bias
        gradients) share a kernel.
    join_sibling_reductions: with `join_earlier_kernels`, a reduction may also join an earlier
        kernel holding a reduction over the same outer and reduction ranges whose inputs it does
        not share (the bias gradients of a query, key and value projection): fewer launches.
    """

    lowerings: Lowerings | None = None
    fuse_rows: bool = True
    row_temporaries: bool = False
    round_low_precision: bool = False
    recompute_cheap: bool = False
    split_reductions: bool = False
    output_views: bool = True
    recompute_transcendental: bool = True
    welford: bool = False
    input_writes: tuple[tuple[int, int], ...] = ()
    private_outputs: tuple[int, ...] = ()
    reuse_extern_outputs: bool = False
    scatter_into_dead_bases: bool = False
    join_earlier_kernels: bool = True
    join_sibling_reductions: bool = True


def lower(gm: fx.GraphModule, options: LowerOptions | None = None, **overrides: Any) -> KernelGraph:
    """Lower a functional ATen graph (every node with meta["val"]) to a scheduled `KernelGraph`.

    `options` (default `LowerOptions()`), with any of its fields given as keyword overrides
    (``lower(gm, fuse_rows=False)``). Raises `LoweringError` naming the node (and its source
    line) that cannot be lowered.
    """
    options = dataclasses.replace(options or LowerOptions(), **overrides)
    lowered = lower_graph(gm, options.lowerings, options.round_low_precision, options.recompute_cheap,
                          options.split_reductions, options.output_views, options.recompute_transcendental,
                          dict(options.input_writes))
    plan = schedule(lowered, fuse_rows=options.fuse_rows, row_temporaries=options.row_temporaries,
                    join_earlier=options.join_earlier_kernels, join_siblings=options.join_sibling_reductions)
    if options.welford:
        plan = welford_schedule(plan)
    plan, stored = plan_input_stores(lowered, plan, options.input_writes)
    if options.reuse_extern_outputs or options.scatter_into_dead_bases:
        plan = plan_extern_output_reuse(lowered, plan, options.reuse_extern_outputs, options.scatter_into_dead_bases)
    kg = build_kernel_graph(gm, lowered, plan, copy_shared_views=not options.output_views)
    return_stored_inputs(kg.gm, stored)
    share_private_outputs(kg.gm, options.private_outputs)
    fewer_calls(kg.gm)
    log.debug("lowered %d ATen nodes into %d kernels and %d externs", len(gm.graph.nodes),
              len(kg.kernels), len(kg.externs))
    return kg


__all__ = ["lower", "verify", "LoweringError", "LowerOptions"]
