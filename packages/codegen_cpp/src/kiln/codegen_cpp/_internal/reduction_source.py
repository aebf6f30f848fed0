"""C++ for reductions: accumulator declarations, the reduction loops and their OpenMP pragmas.

Accuracy and NaN semantics follow torch, written so that GCC vectorizes the loops without
-ffast-math:

* float32 sums accumulate in double (error no longer grows with the reduction size); the
  result is rounded to float once, after the loops.
* max/min keep a NaN count next to the accumulator: the loop body is a plain compare-select,
  which `#pragma omp simd reduction(max:...)` vectorizes, and any NaN seen makes the result NaN.
* argmax/argmin keep the best value and its position; a strictly better value (or the first
  NaN) replaces them, so ties keep the first position. Their loops are serial (no OpenMP
  reduction clause combines pairs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sympy

from .options import CppOptions
from .printer import cpp_expr

_FLOATS = ("float", "double")
# A lane-wise float32 sum (a reduction over outer dims, one output per lane) adds at most this
# many values in float32 lanes before moving them into its float64 total: a short innermost
# reduction loop (a constant of at most this many iterations) is one run, a longer one is cut
# into runs of this length (`reduction_lines`).
LANEWISE_RUN = 32


@dataclasses.dataclass(frozen=True, slots=True)
class PendingReduction:
    """A reduction whose loop body is known; `reduction_lines` wraps it in loops."""

    reduction_type: str
    declarations: tuple[str, ...]  # before the loops
    body: tuple[str, ...]  # inside the innermost loop
    finish: tuple[str, ...]  # after the loops
    clauses: str  # OpenMP reduction clauses; "" when the accumulators do not allow them
    result: str  # the variable holding the reduced value after `finish`
    # A vector reduction that can be split in chunks (vector_loops.split_reduction_lines):
    # `partial`, of C++ type `partial_type`, holds a chunk's result after the first
    # `fold_lines` lines of `finish`; `combine` formats the combination of two partials.
    partial: str = ""
    partial_type: str = ""
    fold_lines: int = 0
    combine: str = ""
    # Vector code only: statements that move the accumulators' partial sums into a wider total
    # (vector_loops.vector_reduction_loop runs them every FLUSH_BLOCKS iterations and after the loop;
    # reduction_lines, for a lane-wise sum, after each run of its innermost loop).
    flush: tuple[str, ...] = ()


def _sum(name: str, ctype: str, value: str, body: list[str]) -> PendingReduction:
    acc = f"acc_{name}"
    acc_type = "double" if ctype == "float" else ctype
    finish: tuple[str, ...] = ()
    result = acc
    if acc_type != ctype:
        result = f"sum_{name}"
        finish = (f"{ctype} {result} = static_cast<{ctype}>({acc});",)
    return PendingReduction("sum", (f"{acc_type} {acc} = 0;",), (*body, f"{acc} = {acc} + {value};"),
                            finish, f"reduction(+:{acc})", result)


def _product(name: str, ctype: str, value: str, body: list[str]) -> PendingReduction:
    acc = f"acc_{name}"
    return PendingReduction("prod", (f"{ctype} {acc} = 1;",), (*body, f"{acc} = {acc} * {value};"), (),
                            f"reduction(*:{acc})", acc)


def lowest_first(reduction_type: str, ctype: str) -> str:
    """The initial accumulator of a max (or argmax) reduction, or of a min."""
    largest = reduction_type in ("max", "argmax")
    if ctype in _FLOATS:
        return f"{'-' if largest else ''}std::numeric_limits<{ctype}>::infinity()"
    if ctype == "bool":
        return "false" if largest else "true"
    return f"std::numeric_limits<{ctype}>::{'lowest' if largest else 'max'}()"


def _arg_extremum(name: str, reduction_type: str, ctype: str, value: str, position: str,
                  body: list[str]) -> PendingReduction:
    best, at = f"best_{name}", f"acc_{name}"
    compare = ">" if reduction_type == "argmax" else "<"
    first_nan = f" || ({value} != {value} && {best} == {best})" if ctype in _FLOATS else ""
    declarations = (f"{ctype} {best} = {lowest_first(reduction_type, ctype)};", f"int64_t {at} = 0;")
    update = f"if ({value} {compare} {best}{first_nan}) {{ {best} = {value}; {at} = {position}; }}"
    return PendingReduction(reduction_type, declarations, (*body, update), (), "", at)


def _extremum(name: str, reduction_type: str, ctype: str, value: str, body: list[str]) -> PendingReduction:
    acc = f"acc_{name}"
    compare = ">" if reduction_type == "max" else "<"
    init = lowest_first(reduction_type, ctype)
    declarations = [f"{ctype} {acc} = {init};"]
    update = [f"{acc} = ({value} {compare} {acc}) ? {value} : {acc};"]
    finish: list[str] = []
    clauses = f"reduction({reduction_type}:{acc})" if has_openmp_clauses(reduction_type, ctype) else ""
    if ctype in _FLOATS:
        nan = f"nan_{name}"
        declarations.append(f"{ctype} {nan} = 0;  // counts NaNs: any makes the result NaN")
        update.append(f"{nan} += ({value} != {value});")
        finish.append(f"if ({nan} != 0) {acc} = std::numeric_limits<{ctype}>::quiet_NaN();")
        clauses += f" reduction(+:{nan})"
    return PendingReduction(reduction_type, tuple(declarations), (*body, *update), tuple(finish), clauses, acc)


def has_openmp_clauses(reduction_type: str, ctype: str) -> bool:
    """Whether OpenMP reduction clauses combine this reduction's accumulators: not the
    (value, position) pairs of argmax/argmin, nor a bool max/min (no `max:` on bool)."""
    return reduction_type not in ("argmax", "argmin") and not (reduction_type in ("max", "min") and ctype == "bool")


def join_reductions(reds: Sequence[PendingReduction]) -> PendingReduction:
    """Reductions over the same ranges as one loop (`kiln.loopir.codegen.shared_reduction_loops`): every accumulator
    declared before it, updated in its one body (each reduction's statements after the ones
    before it, so a value they share is computed once), flushed and folded after it, each as
    when alone. OpenMP clauses only where every reduction has its own (`openmp_loop_key` keeps
    the others apart on the scalar path)."""
    if len(reds) == 1:
        return reds[0]
    clauses = " ".join(red.clauses for red in reds) if all(red.clauses for red in reds) else ""
    return PendingReduction("+".join(red.reduction_type for red in reds),
                            tuple(line for red in reds for line in red.declarations),
                            tuple(line for red in reds for line in red.body),
                            tuple(line for red in reds for line in red.finish), clauses, reds[-1].result,
                            flush=tuple(line for red in reds for line in red.flush))


def start_reduction(name: str, reduction_type: str, ctype: str, value: str | tuple[str, str],
                    body: Sequence[str]) -> PendingReduction:
    """The accumulators and per-element update of reducing `value` (a C++ variable of `ctype`;
    for argmax/argmin a pair of value and position variables) into buffer `name`; `body`
    holds the statements computing `value`."""
    if reduction_type in ("argmax", "argmin"):
        return _arg_extremum(name, reduction_type, ctype, *value, list(body))
    if reduction_type == "sum":
        return _sum(name, ctype, value, list(body))
    if reduction_type == "prod":
        return _product(name, ctype, value, list(body))
    if reduction_type in ("max", "min"):
        return _extremum(name, reduction_type, ctype, value, list(body))
    raise NotImplementedError(f"codegen_cpp cannot generate a {reduction_type!r} reduction ({name})")


def reduction_lines(red: PendingReduction, rvars: Sequence[sympy.Symbol], ranges: Sequence[sympy.Expr],
                    options: CppOptions, parallel: bool) -> list[str]:
    """Declarations, then loops over `ranges` with `red.body` inside (`red.finish` is the
    caller's: it goes after these lines).

    `parallel`: the kernel has no outer loop, so the outermost reduction loop is split over
    threads (when the reduction is large enough) and its partial results combined by OpenMP.
    """
    lines = list(red.declarations)
    depth = 0
    for pos, (var, extent) in enumerate(zip(rvars, ranges)):
        innermost = pos == len(rvars) - 1
        pragma = None
        if red.clauses and pos == 0 and parallel and options.openmp:
            numel = " * ".join(cpp_expr(e) for e in ranges)
            construct = "parallel for simd" if innermost else "parallel for"
            pragma = f"#pragma omp {construct} {red.clauses} if(parallel: ({numel}) >= {options.parallel_threshold})"
        elif red.clauses and innermost:
            pragma = f"#pragma omp simd {red.clauses}"
        if pragma:
            lines.append("    " * depth + pragma)
        lines.append("    " * depth + f"for (int64_t {var} = 0; {var} < {cpp_expr(extent)}; ++{var}) {{")
        depth += 1
    if red.flush and rvars and not _short(ranges[-1]):  # the innermost loop in runs of LANEWISE_RUN
        var, extent = rvars[-1], cpp_expr(ranges[-1])
        lines[-1] = ("    " * (depth - 1) + f"for (int64_t {var}_run = 0; {var}_run < {extent}; "
                     f"{var}_run += {LANEWISE_RUN}) {{")
        lines.append("    " * depth + f"for (int64_t {var} = {var}_run; {var} < std::min<int64_t>({extent}, "
                     f"{var}_run + {LANEWISE_RUN}); ++{var}) {{")
        depth += 1
    lines += ["    " * depth + line for line in red.body]
    for d in range(depth - 1, -1, -1):
        lines.append("    " * d + "}")
        if d == depth - 1:  # after each run of the innermost loop (a lane-wise float32 sum's)
            lines += ["    " * d + line for line in red.flush]
    return lines


def _short(extent: sympy.Expr) -> bool:
    extent = sympy.sympify(extent)
    return extent.is_Integer and int(extent) <= LANEWISE_RUN
