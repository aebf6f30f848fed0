"""Parallel versions of scatters: over columns that never share a destination, or over rows
that each write a block of their own.

A `Scatter` kernel is one serial loop over the source elements, in order (scatter_source.py), so
sums are eager's bit for bit. Most large scatters write whole rows: an embedding's gradient adds
source row q (its elements r0 = q * C + c) into destination row ind(q), element c for element c;
the destination index is ``G * (...) + r0 % C`` with every other term a multiple of G >= C. Two
elements of different columns c then never share a destination (their indices differ by less
than C modulo G), and the elements reaching one destination all have the same column, in
increasing order of q. So the columns can be shared out among threads, each thread walking
every row, in order, over its own columns: each destination receives the same values in the
same order as in the serial loop, results are the serial loop's bit for bit whatever the thread
count, and each thread writes a contiguous run of each destination row.

A scatter along an inner dim (`x.scatter_add(1, index, src)`, `x[rows, index] += v`) is the
other common case: source row q (its elements r0 = q * J + j) writes only into destination block
q, elements ``G * q + rest`` with ``0 <= rest < G`` (rest made of the range-checked indices and
`r0 % m` terms, each at most its bound minus one). Blocks of different rows never meet, and each
destination is reached from one row only, in order: the rows are shared out among threads, each
walking its rows' elements in order, with the same bit-for-bit guarantee. Where both apply, rows
go first (whole blocks a thread, where a few columns a thread would share cache lines).

The function runs such a version first where the sizes and thread count call for it (at least
`parallel_threshold` elements, more than one thread) and returns; else the serial loop runs.
"""

from __future__ import annotations

import math

import sympy

from kiln.loopir import FloorDiv, Kernel, Scatter
from kiln.loopir.codegen import KernelWalker

from .kernel_source import CppHandler
from .options import CppOptions
from .printer import cpp_expr
from .vector_loops import indent


def _store_terms(kernel: Kernel) -> tuple[sympy.Symbol, list[sympy.Expr]] | None:
    """(r0, the terms of the destination index) of a kernel that is one scatter over one source
    range storing once; None for any other kernel."""
    if len(kernel.nodes) != 1 or kernel.ranges or kernel.row_temporaries:
        return None
    (node,) = kernel.nodes
    if not isinstance(node.body, Scatter) or len(node.reduction_ranges) != 1:
        return None
    (rvar,) = kernel.placement(node)[1]
    stores = [a.index for a in kernel.accesses(node).accesses if a.kind == "store" and a.buffer == node.name]
    if len(stores) != 1:
        return None
    return rvar, list(sympy.Add.make_args(sympy.expand(stores[0])))


def _whole_rows(kernel: Kernel, per_row: int) -> bool:
    """Whether the scatter's source length is a whole number of rows of `per_row` elements."""
    return sympy.simplify(sympy.Mod(sympy.sympify(kernel.nodes[0].reduction_ranges[0]), per_row)) == 0


def row_block(kernel: Kernel, indirect_sizes: dict[sympy.Symbol, sympy.Expr]) -> tuple[int, int] | None:
    """(J, G) where `kernel` is a single scatter whose destination index is ``G * (r0 // J)``
    plus terms that stay in [0, G): positive multiples of range-checked indices (at most their
    size - 1, `indirect_sizes`: the walking handler's) and of ``f(r0) % m`` (at most m - 1) (see
    the module docstring); None otherwise."""
    found = _store_terms(kernel)
    if found is None:
        return None
    rvar, terms = found
    block, most = None, 0
    for term in terms:
        coefficient, factor = term.as_coeff_Mul()
        if not coefficient.is_Integer or coefficient <= 0:
            return None
        if factor == rvar or (isinstance(factor, FloorDiv) and factor.args[0] == rvar and factor.args[1].is_Integer):
            if block is not None:
                return None
            block = (1 if factor == rvar else int(factor.args[1]), int(coefficient))
        elif factor in indirect_sizes and indirect_sizes[factor].is_Integer:
            most += int(coefficient) * (int(indirect_sizes[factor]) - 1)
        elif (isinstance(factor, sympy.Mod) and factor.args[1].is_Integer
              and factor.args[0].free_symbols <= {rvar}):  # of r0 (>= 0): in [0, m)
            most += int(coefficient) * (int(factor.args[1]) - 1)
        else:
            return None
    if block is None or most >= block[1] or not _whole_rows(kernel, block[0]):
        return None
    return block


def column_count(kernel: Kernel) -> int | None:
    """C where `kernel` is a single scatter whose destination index is ``r0 % C`` plus terms
    that are all multiples of some G >= C (see the module docstring); None otherwise."""
    found = _store_terms(kernel)
    if found is None:
        return None
    rvar, terms = found
    columns = [t for t in terms if isinstance(t, sympy.Mod) and t.args[0] == rvar and t.args[1].is_Integer]
    if len(columns) != 1 or int(columns[0].args[1]) < 2:
        return None
    count = int(columns[0].args[1])
    step = 0
    for term in terms:
        if term is columns[0]:
            continue
        coefficient, _ = term.as_coeff_Mul()
        if not coefficient.is_Integer:
            return None
        step = math.gcd(step, abs(int(coefficient)))
    if step and step < count:
        return None
    return count if _whole_rows(kernel, count) else None  # (not with a last, partial row)


def parallel_scatter_lines(kernel: Kernel, options: CppOptions) -> list[str]:
    """The row- or column-parallel scatter for `kernel`, at the top of its function: a block that
    runs it and returns when the run-time sizes and thread count call for it. [] when the kernel
    is no such scatter, or its sizes never call for it."""
    if not options.openmp or _store_terms(kernel) is None:
        return []
    (node,) = kernel.nodes
    length = sympy.sympify(node.reduction_ranges[0])
    if length.is_Integer and int(length) < options.parallel_threshold:
        return []
    walker = KernelWalker(kernel, CppHandler(kernel))
    (rvar,) = kernel.placement(node)[1]
    with walker.row_loop(node) as body:
        walker.run(node)
    block = row_block(kernel, walker.handler.indirect_sizes)
    count = column_count(kernel) if block is None else None
    if block is None and count is None:
        return []
    if block is not None:
        head, region = _row_region(rvar, body, *block)
    else:
        head, region = _column_region(rvar, body, count)
    lines = ["{", *indent(head, 1), f"    const int64_t kiln_rows = ({cpp_expr(length)}) / {block[0] if block else count};",
             f"    if (kiln_scan_threads() > 1 && ({cpp_expr(length)}) >= {options.parallel_threshold}) {{"]
    checked = bool(walker.handler.checks)
    if checked:
        lines += ["        int32_t kiln_fail = 0;  // the failed run-time check, 0: none",
                  "        #pragma omp parallel reduction(max:kiln_fail)"]
    else:
        lines += ["        #pragma omp parallel"]
    lines += ["        {", *indent(region, 3), "        }"]
    if checked:
        lines += ["        if (kiln_fail != 0) *kiln_status = kiln_fail;"]
    return lines + ["        return;", "    }", "}"]


def _row_region(rvar: sympy.Symbol, body: list[str], per_row: int, block: int) -> tuple[list[str], list[str]]:
    """(comment, the parallel region's lines) of the row version: rows of `per_row` source
    elements, row q writing into destination elements [block * q, block * (q + 1))."""
    row_of = cpp_expr(FloorDiv(rvar, per_row)) if per_row > 1 else None
    body = [line.replace(row_of, "kiln_q") for line in body] if row_of else body
    head = [f"// rows of {per_row} source elements, row q writing only destination elements {block} * q + [0, {block}):",
            "// each thread scatters whole rows, each in order (the serial loop's sums, bit for bit)"]
    inner = [f"for (int64_t kiln_j = 0; kiln_j < {per_row}; ++kiln_j) {{",
             f"    const int64_t {rvar} = kiln_q * {per_row} + kiln_j;", *indent(body, 1), "}"]
    region = [*_thread_share("kiln_rows", "kiln_first", "kiln_last"),
              "for (int64_t kiln_q = kiln_first; kiln_q < kiln_last; ++kiln_q) {", *indent(inner, 1), "}"]
    return head, region


def _column_region(rvar: sympy.Symbol, body: list[str], count: int) -> tuple[list[str], list[str]]:
    """(comment, the parallel region's lines) of the column version (module docstring)."""
    # r0 = kiln_q * C + kiln_c with 0 <= kiln_c < C: its row and column by name, so what depends
    # on the row only (the destination row, its index check) is visibly invariant in the column loop
    row_of, column_of = cpp_expr(FloorDiv(rvar, count)), cpp_expr(sympy.Mod(rvar, count))
    body = [line.replace(row_of, "kiln_q").replace(column_of, "kiln_c") for line in body]
    head = [f"// rows of {count} columns, no two columns sharing a destination: each thread scatters",
            "// its own columns of every row, in row order (the serial loop's sums, bit for bit)"]
    inner = ["for (int64_t kiln_c = kiln_begin; kiln_c < kiln_end; ++kiln_c) {",
             f"    const int64_t {rvar} = kiln_q * {count} + kiln_c;", *indent(body, 1), "}"]
    region = [*_thread_share(str(count), "kiln_begin", "kiln_end"),
              "for (int64_t kiln_q = 0; kiln_q < kiln_rows; ++kiln_q) {", *indent(inner, 1), "}"]
    return head, region


def _thread_share(total: str, first: str, last: str) -> list[str]:
    """C++ declaring [first, last): this OpenMP thread's equal share of `total` items."""
    return ["const int64_t kiln_t = omp_get_thread_num(), kiln_n = omp_get_num_threads();",
            f"const int64_t {first} = {total} * kiln_t / kiln_n, {last} = {total} * (kiln_t + 1) / kiln_n;"]
