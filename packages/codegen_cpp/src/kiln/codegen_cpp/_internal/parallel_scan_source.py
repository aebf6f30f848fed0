"""A parallel two-pass scan, for long scans over fewer rows than threads.

A scan kernel's serial loop (`scan_source.py`) runs one row per thread at most: `x.cumsum(-1)`
on a (1, 10^6) tensor runs on one thread, one dependent add per element. For such kernels the
function first tries this version (chosen at run time: the thread count is only known then):

1. the scanned dim is cut into chunks, a number that depends on its length only (at most
   MAX_CHUNKS, at least MIN_CHUNK elements each), so the result does not depend on the
   thread count; every (row, chunk) pair folds its chunk into a state of its own, in
   parallel (sums and products as an `omp simd` reduction, which GCC vectorizes);
2. per row, in chunk order, each chunk's state is replaced by the state of the chunks before
   it (an exclusive scan over a few hundred states at most, serial);
3. every (row, chunk) pair scans its chunk again from that state, storing each step, in
   parallel.

cummax/cummin (values and positions) are exact: joining a chunk's state (its best value and
the position of the last element that is as large, or of its last NaN) into the state before
it is the serial update itself. Float sums, products and logaddexp are reassociated (chunk
totals, and the reordered fold of pass 1): float32 accumulates in double, so its results stay
eager's once rounded (they differ only where the double sum lies within ~1e-16 of a rounding
boundary); float64 and integer-valued float results may differ from eager's serial order by a
few ulp of the running value.
"""

from __future__ import annotations

import sympy

from kiln.loopir import Kernel, Scan, Scatter, index_vars
from kiln.loopir.codegen import KernelWalker

from .kernel_source import CppHandler
from .options import CppOptions
from .printer import cpp_expr
from .scan_source import ScanState
from .vector_loops import indent

MIN_CHUNK = 1024  # elements: below, the chunk's fixed costs outweigh the second pass it buys
MAX_CHUNKS = 256  # per row: the serial pass over chunk states stays short
MAX_STATIC_ROWS = 1024  # more rows than any host has threads: the path is not generated


def _eligible(kernel: Kernel, options: CppOptions) -> bool:
    if not options.openmp or len(kernel.nodes) != 1 or kernel.row_temporaries:
        return False
    (node,) = kernel.nodes
    if not isinstance(node.body, Scan) or isinstance(node.body, Scatter):
        return False
    length = sympy.sympify(node.reduction_ranges[0])
    rows = sympy.Mul(*kernel.ranges)
    if length.is_Integer and int(length) < 2 * MIN_CHUNK:
        return False
    if rows.is_Integer and int(rows) >= MAX_STATIC_ROWS:
        return False
    work = rows * length
    return not (work.is_Integer and int(work) < options.parallel_threshold)


def parallel_scan_lines(kernel: Kernel, options: CppOptions) -> list[str]:
    """The two-pass scan for `kernel`, at the top of its function: a block that runs it and
    returns when the run-time sizes and thread count call for it. [] when the kernel is no
    single scan, or its sizes never call for it."""
    if not _eligible(kernel, options):
        return []
    (node,) = kernel.nodes
    walker = KernelWalker(kernel, CppHandler(kernel))
    (rvar,) = kernel.placement(node)[1]
    with walker.row_loop(node) as body:
        walker.run(node)
    state = walker.handler.scan_state
    if walker.handler.checks or state is None:  # run-time checks: the serial loop folds kiln_fail
        return []
    # pass 1 stores nothing (what uses the result at each step is then dead code, removed)
    fold_body = [line for line in body if not line.startswith(f"out_{node.name}[")]
    rows = " * ".join(f"({cpp_expr(e)})" for e in kernel.ranges) or "1"
    lines = ["{",
             "    // a long scan over few rows: two passes over chunks of the scanned dim, in parallel",
             f"    const int64_t kiln_rows = {rows}, kiln_length = {cpp_expr(node.reduction_ranges[0])};",
             f"    const int64_t kiln_chunks = std::min<int64_t>({MAX_CHUNKS}, kiln_length / {MIN_CHUNK});",
             "    if (kiln_chunks >= 2 && kiln_rows < kiln_scan_threads() && "
             f"kiln_rows * kiln_length >= {options.parallel_threshold}) {{",
             "        const int64_t kiln_chunk = (kiln_length + kiln_chunks - 1) / kiln_chunks;"]
    lines += indent([f"std::unique_ptr<{t}[]> kiln_start_{k}(new {t}[kiln_rows * kiln_chunks]);"
                     for k, t in enumerate(state.ctypes)], 2)
    saved = [f"kiln_start_{k}[kiln_task] = {n};" for k, n in enumerate(state.names)]
    pragma = f"#pragma omp simd reduction({state.omp_reduction}:{state.names[0]})" if state.omp_reduction else None
    lines += indent(["// pass 1: each chunk's own state"]
                    + _chunk_loop(kernel, rvar, state.declarations(), fold_body, pragma, saved), 2)
    lines += indent(_chunk_starts(state), 2)
    starts = tuple(f"kiln_start_{k}[kiln_task]" for k in range(len(state.names)))
    lines += indent(["// pass 2: each chunk scanned again from the state before it, storing every step"]
                    + _chunk_loop(kernel, rvar, state.declarations(starts), body, None, []), 2)
    return lines + ["        return;", "    }", "}"]


def _chunk_loop(kernel: Kernel, rvar: sympy.Symbol, declarations: list[str], body: list[str],
                pragma: str | None, after: list[str]) -> list[str]:
    """A parallel loop over (row, chunk) pairs: the row's outer indices, the chunk's bounds,
    the state declared, the chunk's loop over `body`, then `after`."""
    inner = [f"for (int64_t {rvar} = kiln_begin; {rvar} < kiln_end; ++{rvar}) {{", *indent(body, 1), "}"]
    task = [*_outer_indices(kernel),
            "const int64_t kiln_begin = (kiln_task % kiln_chunks) * kiln_chunk;",
            "const int64_t kiln_end = std::min<int64_t>(kiln_length, kiln_begin + kiln_chunk);",
            *declarations, *([pragma] if pragma else []), *inner, *after]
    return ["#pragma omp parallel for",
            "for (int64_t kiln_task = 0; kiln_task < kiln_rows * kiln_chunks; ++kiln_task) {",
            *indent(task, 1), "}"]


def _outer_indices(kernel: Kernel) -> list[str]:
    """The kernel's outer loop indices (i0, i1, ...) of the task's row, innermost fastest."""
    ivars = index_vars(len(kernel.ranges))
    lines = ["int64_t kiln_rest = kiln_task / kiln_chunks;"]
    for pos in range(len(ivars) - 1, -1, -1):
        extent = f"({cpp_expr(kernel.ranges[pos])})"
        if pos == 0:
            lines.append(f"const int64_t {ivars[pos]} = kiln_rest;")
        else:
            lines += [f"const int64_t {ivars[pos]} = kiln_rest % {extent};", f"kiln_rest /= {extent};"]
    return lines if ivars else lines[:0]


def _chunk_starts(state: ScanState) -> list[str]:
    """Per row, in chunk order: each chunk's state becomes the state of the chunks before it."""
    carry = tuple(f"carry_{k}" for k in range(len(state.names)))
    chunk = tuple(f"chunk_{k}" for k in range(len(state.names)))
    value = chunk if state.is_position else chunk[0]
    step = [f"{t} {c} = kiln_start_{k}[kiln_at];" for k, (t, c) in enumerate(zip(state.ctypes, chunk))]
    step += [f"kiln_start_{k}[kiln_at] = {c};" for k, c in enumerate(carry)]
    step += state.update(value, into=carry)
    declarations = [f"{t} {c} = {v};" for t, c, v in zip(state.ctypes, carry, state.initial)]
    return ["// the state each chunk starts from: the chunks before it, joined in order",
            "for (int64_t kiln_row = 0; kiln_row < kiln_rows; ++kiln_row) {",
            *indent(declarations, 1),
            "    for (int64_t kiln_at = kiln_row * kiln_chunks; kiln_at < (kiln_row + 1) * kiln_chunks; ++kiln_at) {",
            *indent(step, 2), "    }", "}"]
