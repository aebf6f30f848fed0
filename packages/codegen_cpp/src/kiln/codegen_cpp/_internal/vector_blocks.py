"""Reductions over outer dims, OUTPUT_BLOCK output vectors at a time (unroll and jam).

A kernel whose lanes run across its outputs (`x.sum(0)`: each lane reduces a column) walks, for
one output vector, every row of the reduced dim: one load per row, rows a whole row's length
apart (8 KB for 2048 floats), so each load touches another page and no prefetcher follows it;
a 2048x2048 sum ran at about half of eager's speed (which reads rows contiguously). Here the
vector loop goes by blocks of OUTPUT_BLOCK vectors, and the reduction loops of the block's
vectors are one loop whose body holds every vector's statements in turn: each row is read
OUTPUT_BLOCK vectors at a time (contiguous), OUTPUT_BLOCK loads in flight per row, and
OUTPUT_BLOCK times fewer page changes. The statements are the same per vector (renamed
apart), so the results are the same bits.

The body of one output vector (`function_source`'s across-outputs statements) is rewritten
textually: it must consist of statements, comments, `for (...) {` loop headers and `}` (the
reduction loops); anything else (a tail `if`, a row node's strided stores) keeps the plain loop.
"""

from __future__ import annotations

import re

import sympy

from .printer import cpp_expr
from .vector_loops import indent

OUTPUT_BLOCK = 4  # output vectors per block: 4 float64 totals (8 registers) fit AVX2's 16
# Blocks only where the vector loop is long enough to give every thread several blocks (a
# channels-last batch norm's 64 channels are 4 AVX-512 vectors: one block would be one thread).
MIN_BLOCKED_EXTENT = 1024

_DECLARATION = re.compile(
    r"^\s*(?:const\s+|constexpr\s+)?(?:auto|float|double|bool|int64_t|int32_t|kiln::\w+)\s+(\w+)\s*(?:=|\[|;|\{)")
_LOOP_HEADER = re.compile(r"^\s*for \(.*\{(\s*//.*)?$")


def _declared_names(body: list[str]) -> list[str]:
    return [m.group(1) for line in body if not _LOOP_HEADER.match(line) and (m := _DECLARATION.match(line))]


def _renamer(names: list[str], var: sympy.Symbol):
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in [*names, str(var)]) + r")\b")
    return lambda line, part: pattern.sub(lambda m: f"{m.group(1)}_p{part}", line)


def _structured(body: list[str]) -> bool:
    """Only statements, comments, loop headers and closing braces (balanced)."""
    depth = 0
    for line in body:
        text = line.strip()
        if _LOOP_HEADER.match(line):
            depth += 1
        elif text == "}":
            depth -= 1
        elif text.endswith("{") or text.startswith("}") or text.startswith(("if", "else", "#")) or depth < 0:
            return False
    return depth == 0


def _jammed(body: list[str], var: sympy.Symbol) -> list[str]:
    """`body` for OUTPUT_BLOCK vectors: loop headers and braces once, each run of statements
    between them once per vector (its names suffixed `_p<k>`, its lane variable `var_p<k>`)."""
    rename = _renamer(_declared_names(body), var)
    out: list[str] = []
    run: list[str] = []

    def flush_run() -> None:
        for part in range(OUTPUT_BLOCK):
            out.extend(rename(line, part) for line in run if part == 0 or not line.strip().startswith("//"))
        run.clear()

    for line in body:
        if _LOOP_HEADER.match(line) or line.strip() == "}":
            flush_run()
            out.append(line)
        else:
            run.append(line)
    flush_run()
    return out


def blocked_vector_loop(var: sympy.Symbol, extent: sympy.Expr, body: list[str]) -> list[str] | None:
    """The vector loop over `extent` outputs by blocks of OUTPUT_BLOCK vectors (the reduction
    loops of the block jammed into one), then the whole vectors left and the tail one at a
    time; None where the body or the extent does not allow it (see the module docstring)."""
    extent = sympy.sympify(extent)
    if not (extent.is_Integer and int(extent) >= MIN_BLOCKED_EXTENT) or not _structured(body):
        return None
    if not any(_LOOP_HEADER.match(line) for line in body):  # no reduction loop: nothing to jam
        return None
    n = cpp_expr(extent)
    block, blocks_end, end = f"{var}_block", f"({n} - {n} % ({OUTPUT_BLOCK} * KILN_LANES))", f"kiln::vector_end({n})"
    lanes = [f"const int64_t {var}_p{part} = {block} + {part} * KILN_LANES;" for part in range(OUTPUT_BLOCK)]
    return [f"for (int64_t {block} = 0; {block} < {blocks_end}; {block} += {OUTPUT_BLOCK} * KILN_LANES) {{"
            f"  // vector code, {OUTPUT_BLOCK} output vectors per block",
            "    constexpr int64_t active = KILN_LANES;", *indent(lanes, 1), *indent(_jammed(body, var), 1), "}",
            f"for (int64_t {var} = {blocks_end}; {var} < {end}; {var} += KILN_LANES) {{  // vector code",
            "    constexpr int64_t active = KILN_LANES;", *indent(body, 1), "}",
            f"if ({end} < {n}) {{  // the tail: one partial vector",
            f"    const int64_t {var} = {end}, active = {n} - {var};", *indent(body, 1), "}"]
