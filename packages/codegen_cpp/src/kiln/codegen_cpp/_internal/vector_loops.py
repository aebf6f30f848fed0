"""The loops of vector code: a loop over whole vectors and its tail, a reduction loop with
PARTS accumulators, and a reduction split into chunks across threads.

Every loop runs the same statements (`body`) on whole vectors (`active` = KILN_LANES, a
compile-time constant) and then once on the tail (fewer `active` lanes: loads and stores move
that many elements, reductions ignore the other lanes).
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from .options import CppOptions
from .printer import cpp_expr
from .reduction_source import PendingReduction, join_reductions
from .vector_reduction_source import PARTS

# A reduction split across threads is reduced in this many chunks, each to one partial result,
# combined in chunk order after the parallel loop: the result does not depend on the number
# of threads.
CHUNKS = 64
# A float32 sum's float32 partials go to its float64 total after this many iterations of the
# main reduction loop: each partial adds at most FLUSH_BLOCKS + PARTS values.
FLUSH_BLOCKS = 8


def indent(lines: list[str], depth: int) -> list[str]:
    return ["    " * depth + line for line in lines]


def vector_loop(var: sympy.Symbol, extent: sympy.Expr, body: list[str], pragma: str | None = None) -> list[str]:
    """A loop as vector code: whole vectors (`pragma` on that loop), then the tail as one
    partial vector."""
    end, extent_text = f"kiln::vector_end({cpp_expr(extent)})", cpp_expr(extent)
    return [*([pragma] if pragma else []),
            f"for (int64_t {var} = 0; {var} < {end}; {var} += KILN_LANES) {{  // vector code",
            "    constexpr int64_t active = KILN_LANES;", *indent(body, 1), "}",
            f"if ({end} < {extent_text}) {{  // the tail: one partial vector",
            f"    const int64_t {var} = {end}, active = {extent_text} - {var};", *indent(body, 1), "}"]


def vector_reduction_loop(var: sympy.Symbol, extent: sympy.Expr, body: list[str], start: str = "0",
                          stop: str | None = None, flush: Sequence[str] = ()) -> list[str]:
    """A reduction loop over [start, stop) (default: [0, extent)) as vector code with PARTS
    accumulators: each iteration of the main loop runs `body` on PARTS consecutive vectors,
    vector `k` into accumulator `part` k; the whole vectors left over, then the tail, go to
    accumulator 0. `flush` (a float32 sum's move of its partials into its float64 total) runs
    after every FLUSH_BLOCKS iterations of the main loop and once at the end."""
    hi = stop or cpp_expr(extent)

    def multiple_end(step: str) -> str:  # where whole steps from `start` end
        if start == "0":
            return f"({hi} - {hi} % ({step}))"
        return f"({hi} - ({hi} - {start}) % ({step}))"

    block, blocks_end = f"{var}_block", multiple_end(f"{PARTS} * KILN_LANES")
    end = f"kiln::vector_end({hi})" if start == "0" else multiple_end("KILN_LANES")
    blocks = []
    for part in range(PARTS):
        blocks += indent(["{", f"    constexpr int part = {part};", "    constexpr int64_t active = KILN_LANES;",
                          f"    const int64_t {var} = {block} + {part} * KILN_LANES;", *indent(body, 1), "}"], 1)
    header = f"  // vector code, {PARTS} accumulators"
    if flush:
        span, span_end = f"{var}_span", f"{var}_span_end"
        lines = [f"for (int64_t {span} = {start}; {span} < {blocks_end}; "
                 f"{span} += {FLUSH_BLOCKS} * {PARTS} * KILN_LANES) {{",
                 f"    const int64_t {span_end} = std::min<int64_t>({blocks_end}, "
                 f"{span} + {FLUSH_BLOCKS} * {PARTS} * KILN_LANES);",
                 f"    for (int64_t {block} = {span}; {block} < {span_end}; {block} += {PARTS} * KILN_LANES) {{"
                 + header, *indent(blocks, 1), "    }", *indent(list(flush), 1), "}"]
    else:
        lines = [f"for (int64_t {block} = {start}; {block} < {blocks_end}; {block} += {PARTS} * KILN_LANES) {{"
                 + header, *blocks, "}"]
    lines += [f"for (int64_t {var} = {blocks_end}; {var} < {end}; {var} += KILN_LANES) {{  // vector code",
              "    constexpr int part = 0;", "    constexpr int64_t active = KILN_LANES;", *indent(body, 1), "}",
              f"if ({end} < {hi}) {{  // the tail: one partial vector",
              f"    const int64_t {var} = {end}, active = {hi} - {var};", "    constexpr int part = 0;",
              *indent(body, 1), "}", *flush]
    return lines


def split_reduction_lines(reds: Sequence[PendingReduction], afters: Sequence[list[str]],
                          rvars: Sequence[sympy.Symbol], ranges: Sequence[sympy.Expr], options: CppOptions
                          ) -> list[str]:
    """Vector reductions of a kernel without outer loop (one, or several sharing their loop:
    `kiln.loopir.codegen.shared_reduction_loops`), the outermost reduction loop split in CHUNKS chunks across threads
    (when the reduction is large enough): each chunk reduces to a partial result per
    reduction, then each reduction's partials are combined in chunk order. `afters[k]` is
    what follows the loop for `reds[k]` (it starts with its `finish`)."""
    for red, after in zip(reds, afters):
        assert tuple(after[:len(red.finish)]) == red.finish, "the fold must follow the reduction loop"
    joined = join_reductions(reds)
    n, var = cpp_expr(ranges[0]), rvars[0]
    chunk_len = f"kiln_chunk_{reds[0].partial}"
    lo, hi = f"{var}_lo", f"{var}_hi"
    if len(rvars) == 1:  # chunks of whole vector blocks
        step = f"{PARTS} * KILN_LANES"
        loops = vector_reduction_loop(var, ranges[0], list(joined.body), lo, hi, joined.flush)
    else:  # chunks of the outermost loop, vector code innermost
        step = "1"
        inner = vector_reduction_loop(rvars[-1], ranges[-1], list(joined.body), flush=joined.flush)
        for depth in range(len(rvars) - 2, 0, -1):
            inner = [f"for (int64_t {rvars[depth]} = 0; {rvars[depth]} < {cpp_expr(ranges[depth])}; "
                     f"++{rvars[depth]}) {{", *indent(inner, 1), "}"]
        loops = [f"for (int64_t {var} = {lo}; {var} < {hi}; ++{var}) {{", *indent(inner, 1), "}"]
    loop_body = [f"const int64_t {lo} = std::min<int64_t>({n}, kiln_chunk * {chunk_len});",
                 f"const int64_t {hi} = std::min<int64_t>({n}, {lo} + {chunk_len});",
                 *joined.declarations, *loops, *(line for red in reds for line in red.finish[:red.fold_lines]),
                 *(f"partials_{red.partial}[kiln_chunk] = {red.partial};" for red in reds)]
    numel = " * ".join(f"({cpp_expr(e)})" for e in ranges)
    lines = [f"// split in {CHUNKS} chunks across threads, combined in chunk order",
             *(f"{red.partial_type} partials_{red.partial}[{CHUNKS}];" for red in reds),
             f"const int64_t {chunk_len} = (({n} + {CHUNKS - 1}) / {CHUNKS} + {step} - 1) / ({step}) * ({step});",
             f"#pragma omp parallel for if(parallel: {numel} >= {options.parallel_threshold})",
             f"for (int64_t kiln_chunk = 0; kiln_chunk < {CHUNKS}; ++kiln_chunk) {{", *indent(loop_body, 1), "}"]
    for red, after in zip(reds, afters):
        name = red.partial
        combined = red.combine.format(name, f"partials_{name}[kiln_chunk]")
        lines += [f"{red.partial_type} {name} = partials_{name}[0];",
                  f"for (int64_t kiln_chunk = 1; kiln_chunk < {CHUNKS}; ++kiln_chunk) {name} = {combined};",
                  *after[red.fold_lines:]]
    return lines
