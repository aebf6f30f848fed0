"""A parallel version of a scatter whose columns never share a destination.

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

The function runs this version first where the sizes and thread count call for it (at least
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


def column_count(kernel: Kernel) -> int | None:
    """C where `kernel` is a single scatter whose destination index is ``r0 % C`` plus terms
    that are all multiples of some G >= C (see the module docstring); None otherwise."""
    if len(kernel.nodes) != 1 or kernel.ranges or kernel.row_temporaries:
        return None
    (node,) = kernel.nodes
    if not isinstance(node.body, Scatter) or len(node.reduction_ranges) != 1:
        return None
    (rvar,) = kernel.placement(node)[1]
    stores = [a.index for a in kernel.accesses(node).accesses if a.kind == "store" and a.buffer == node.name]
    if len(stores) != 1:
        return None
    terms = sympy.Add.make_args(sympy.expand(stores[0]))
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
    if sympy.simplify(sympy.Mod(sympy.sympify(node.reduction_ranges[0]), count)) != 0:
        return None  # a last, partial row
    return count


def parallel_scatter_lines(kernel: Kernel, options: CppOptions) -> list[str]:
    """The column-parallel scatter for `kernel`, at the top of its function: a block that runs
    it and returns when the run-time sizes and thread count call for it. [] when the kernel is
    no such scatter, or its sizes never call for it."""
    if not options.openmp:
        return []
    count = column_count(kernel)
    if count is None:
        return []
    (node,) = kernel.nodes
    length = sympy.sympify(node.reduction_ranges[0])
    if length.is_Integer and int(length) < options.parallel_threshold:
        return []
    walker = KernelWalker(kernel, CppHandler(kernel))
    (rvar,) = kernel.placement(node)[1]
    with walker.row_loop(node) as body:
        walker.run(node)
    checked = bool(walker.handler.checks)
    # r0 = kiln_q * C + kiln_c with 0 <= kiln_c < C: its row and column by name, so what depends
    # on the row only (the destination row, its index check) is visibly invariant in the column loop
    row_of, column_of = cpp_expr(FloorDiv(rvar, count)), cpp_expr(sympy.Mod(rvar, count))
    body = [line.replace(row_of, "kiln_q").replace(column_of, "kiln_c") for line in body]
    inner = ["for (int64_t kiln_c = kiln_begin; kiln_c < kiln_end; ++kiln_c) {",
             f"    const int64_t {rvar} = kiln_q * {count} + kiln_c;", *indent(body, 1), "}"]
    region = ["const int64_t kiln_t = omp_get_thread_num(), kiln_n = omp_get_num_threads();",
              f"const int64_t kiln_begin = {count} * kiln_t / kiln_n, kiln_end = {count} * (kiln_t + 1) / kiln_n;",
              "for (int64_t kiln_q = 0; kiln_q < kiln_rows; ++kiln_q) {", *indent(inner, 1), "}"]
    lines = ["{",
             f"    // rows of {count} columns, no two columns sharing a destination: each thread scatters",
             "    // its own columns of every row, in row order (the serial loop's sums, bit for bit)",
             f"    const int64_t kiln_rows = ({cpp_expr(length)}) / {count};",
             f"    if (kiln_scan_threads() > 1 && kiln_rows * {count} >= {options.parallel_threshold}) {{"]
    if checked:
        lines += ["        int32_t kiln_fail = 0;  // the failed run-time check, 0: none",
                  "        #pragma omp parallel reduction(max:kiln_fail)"]
    else:
        lines += ["        #pragma omp parallel"]
    lines += ["        {", *indent(region, 3), "        }"]
    if checked:
        lines += ["        if (kiln_fail != 0) *kiln_status = kiln_fail;"]
    return lines + ["        return;", "    }", "}"]
