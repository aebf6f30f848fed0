"""One kernel as one C++ function: the loop nest, OpenMP pragmas, and each node's statements.

One kernel becomes one `extern "C"` function: pointer parameters for inputs and outputs,
`int64_t` parameters for size symbols, one loop nest over the kernel's outer ranges, and the
nodes' statements in order inside it (written by `kernel_source.CppHandler`). The innermost
loop of a pointwise kernel is vector code on kiln's SIMD layer (`vector_source.py`) followed by
a scalar tail; a kernel that cannot be vectorized keeps scalar loops, and a comment says why.
Reduction loops are in `reduction_source.py`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import sympy

from kiln.loopir import ComputedBuffer, Kernel, Reduction, index_vars
from kiln.loopir.codegen import CheckSite, KernelWalker, node_summary, shared_reduction_loops

from . import random_source, scan_source
from .kernel_source import C_TYPES, PRELUDE, CppHandler, c_type, storage_type
from .low_precision import VECTOR_CONVERSIONS
from .options import LIGHT_OPS, CppOptions, light_parallel_threshold
from .parallel_scan_source import parallel_scan_lines
from .parallel_scatter_source import parallel_scatter_lines
from .printer import cpp_expr
from .reduction_source import PendingReduction, has_openmp_clauses, join_reductions, reduction_lines
from .stream_stores import with_stream_stores
from .vector_blocks import blocked_vector_loop
from .vector_hoist import hoist_lane_values
from .vector_layer import VECTOR_LAYER
from .vector_loops import indent, split_reduction_lines, vector_loop, vector_reduction_loop
from .vector_math import VECTOR_MATH
from .vector_segments import MAX_SEGMENTS, segment_loops, split_segments
from .vector_source import CppVectorHandler, NotVectorizable


def loop(var: sympy.Symbol, extent: sympy.Expr) -> str:
    return f"for (int64_t {var} = 0; {var} < {cpp_expr(extent)}; ++{var})"


def _node_comment(node: ComputedBuffer, in_register: bool) -> str:
    return f"// {node_summary(node)}" + (" (local only)" if in_register else "")


def _scratch_lines(kernel: Kernel) -> list[str]:
    """Declarations of the row scratch arrays of `kernel`'s row temporaries (one row each)."""
    numel = " * ".join(f"({cpp_expr(e)})" for e in kernel.row_ranges)
    lines = []
    for node in kernel.row_temporaries:
        ctype = c_type(node.spec.dtype)
        lines += [f"std::unique_ptr<{ctype}[]> row_{node.name}_storage(new {ctype}[{numel}]);",
                  f"{ctype}* __restrict__ row_{node.name} = row_{node.name}_storage.get();"]
    return lines


def _single_outer_point(kernel: Kernel) -> bool:
    """No outer loop to parallelize (all outer ranges are 1): inner loops get the threads."""
    return all(r == 1 for r in kernel.ranges)


TILE = 16  # rows of a transposing kernel's 2-D tile


def _loop_nest(rvars: Sequence[sympy.Symbol], ranges: Sequence[sympy.Expr], body: list[str],
               innermost_pragma: str | None, vector: bool, reduction: bool = False,
               flush: Sequence[str] = ()) -> list[str]:
    """Loops over `ranges`; the innermost one is vector code (a reduction's with PARTS
    accumulators, `flush` its partials' move to a wider total), or scalar with a pragma."""
    lines: list[str] = []
    for depth, (var, extent) in enumerate(zip(rvars, ranges)):
        if depth < len(rvars) - 1:
            lines += indent([loop(var, extent) + " {"], depth)
        elif vector and reduction:
            lines += indent(vector_reduction_loop(var, extent, body, flush=flush), depth)
        elif vector:
            lines += indent(vector_loop(var, extent, body), depth)
        else:
            lines += indent([innermost_pragma] if innermost_pragma else [], depth)
            lines += indent([loop(var, extent) + " {"] + indent(body, 1) + ["}"], depth)
    for depth in range(len(rvars) - 2, -1, -1):
        lines += indent(["}"], depth)
    return lines


def _row_lines(walker: KernelWalker, node: ComputedBuffer, options: CppOptions) -> list[str]:
    """A row node: its own loop over the kernel's row ranges, storing every element."""
    kernel = walker.kernel
    rvars = index_vars(len(kernel.row_ranges), "r")
    vector = isinstance(walker.handler, CppVectorHandler)
    across = vector and walker.handler.across_outputs
    if vector:  # the lanes run along the row, or across the outputs (scalar row loops around vector code)
        walker.handler.lane_var = walker.handler.lane_loop if across else rvars[-1]
    with walker.row_loop(node) as body:
        walker.run(node)
    where = " (row loop, scratch row)" if node.name in walker.handler.row_temporaries else " (row loop)"
    if across:
        return [_node_comment(node, False) + where] + _loop_nest(rvars, kernel.row_ranges, body, None, False)
    pragma = "#pragma omp simd"
    clause = parallel_if(kernel.row_ranges, options) if _single_outer_point(kernel) and options.openmp else None
    if vector:  # the outermost row loop is split across threads (its tail, if vector code, is not)
        lines = _loop_nest(rvars, kernel.row_ranges, body, None, True)
        if clause is not None:
            lines.insert(0, f"#pragma omp parallel for{clause}")
        return [_node_comment(node, False) + where] + lines
    if len(rvars) == 1 and clause is not None:
        pragma = f"#pragma omp parallel for simd{clause}"
    return [_node_comment(node, False) + where] + _loop_nest(rvars, kernel.row_ranges, body, pragma, vector)


def _node_lines(walker: KernelWalker, node: ComputedBuffer, kind: str, options: CppOptions) -> list[str]:
    """Statements computing one node (not a reduction) inside the outer loop nest."""
    handler = walker.handler
    vector = isinstance(handler, CppVectorHandler)
    if kind == "row":
        return _row_lines(walker, node, options)
    comment = _node_comment(node, node.name not in handler.outputs)
    if kind == "scan":
        return [comment] + _scan_lines(walker, node)
    if vector:  # vector code only where the kernel's innermost loop is the vector loop
        handler.lane_var = handler.lane_loop if _pointwise_only(walker.kernel) or handler.across_outputs else None
    with walker.pointwise(node) as body:
        walker.run(node)
    return [comment] + body


def _shared_loop(walker: KernelWalker, nodes: Sequence[ComputedBuffer], lane_var: sympy.Symbol | None
                 ) -> tuple[list[PendingReduction], list[list[str]]]:
    """Each node's reduction, its loop body after the ones before it (a later node sees the
    values of the loop body, not what follows the loop), and what follows the loop for each
    (its fold and store). `lane_var`: the vector handler's lanes in the loop."""
    handler = walker.handler
    reductions, afters = [], []
    for position, node in enumerate(nodes):
        if lane_var is not None:
            handler.lane_var = lane_var
        with walker.reduction(node) as parts:
            if position:
                handler.cache = dict(handler.loop_cache)
            walker.run(node)
        reductions.append(handler.pending_reduction)
        afters.append(parts.after)
    return reductions, afters


def _reduction_lines(walker: KernelWalker, nodes: Sequence[ComputedBuffer], options: CppOptions,
                     parallel_reduction: bool) -> list[str]:
    """One loop over the reduction ranges of `nodes` (one node, or several sharing the loop:
    `kiln.loopir.codegen.shared_reduction_loops`), then each node's fold and store."""
    handler = walker.handler
    vector = isinstance(handler, CppVectorHandler)
    comments = [_node_comment(node, node.name not in handler.outputs) for node in nodes]
    if len(nodes) > 1:
        comments.append(f"// one loop for the {len(nodes)} reductions above")
    rvars, ranges = walker.kernel.placement(nodes[0])[1], nodes[0].reduction_ranges
    if vector and handler.across_outputs:  # each lane reduces for its own output: scalar loops around vector code
        reductions, afters = _shared_loop(walker, nodes, handler.lane_loop)
        return comments + reduction_lines(join_reductions(reductions), rvars, ranges, options, False) \
            + [line for after in afters for line in after]
    if vector and not rvars:
        raise NotVectorizable("a reduction over no dim (a 0-d input)")
    reductions, afters = _shared_loop(walker, nodes, rvars[-1] if vector else None)
    red = join_reductions(reductions)
    after = [line for lines in afters for line in lines]
    if vector and parallel_reduction and options.openmp:
        unsplittable = [r.reduction_type for r in reductions if not r.combine]
        if unsplittable:
            raise NotVectorizable(f"a {unsplittable[0]} reduction split across threads")
        return comments + split_reduction_lines(reductions, afters, rvars, ranges, options)
    if vector:
        loops = list(red.declarations) + _loop_nest(rvars, ranges, list(red.body), None, True, reduction=True,
                                                    flush=red.flush)
    else:
        loops = reduction_lines(red, rvars, ranges, options, parallel_reduction)
    return comments + loops + after


def _scan_lines(walker: KernelWalker, node: ComputedBuffer) -> list[str]:
    """A scan: the running value declared, then a sequential loop along the scanned dim
    storing it at every step (in a block of its own: each outer point starts afresh)."""
    (rvar,) = walker.kernel.placement(node)[1]
    with walker.row_loop(node) as body:
        walker.run(node)
    init = walker.handler.scan_init
    return ["{", *indent(init + [loop(rvar, node.reduction_ranges[0]) + " {"] + indent(body, 1) + ["}"], 1), "}"]


def parallel_if(work: Sequence[sympy.Expr], options: CppOptions, threshold: int | None = None) -> str | None:
    """The `if` clause of a parallel construct over a loop nest of extents `work`: "" when it
    always holds, None when it never does (sizes known below `threshold`, by default
    `parallel_threshold`). Such a loop nest is then no parallel construct at all: GCC 12 does
    not vectorize the loop of a `parallel for simd if(0)`."""
    threshold = options.parallel_threshold if threshold is None else threshold
    total = sympy.Mul(*work)
    if total.is_Integer:
        return "" if int(total) >= threshold else None
    return f" if(({' * '.join(cpp_expr(e) for e in work)}) >= {threshold})"


def _pointwise_only(kernel: Kernel) -> bool:
    return not kernel.row_ranges and not any(isinstance(n.body, Reduction) for n in kernel.nodes)


def _kernel_body(kernel: Kernel, options: CppOptions) -> tuple[list[str], CppHandler, str]:
    """The statements inside the kernel's outer loops, their handler, and "" when they are
    vector code (else why not)."""
    why = _why_scalar(kernel, options)
    if not why:
        try:
            strided = _pointwise_only(kernel) and len(kernel.ranges) >= 2  # transposes: tiled
            return _node_statements(kernel, options, CppVectorHandler(kernel, strided_loads=strided)) + ("",)
        except NotVectorizable as exc:
            why = f"not vectorized: {exc}"
        segmented = _segmented_statements(kernel, options)
        if segmented is not None:
            return segmented + ("",)
        rows = any(kernel.is_row(n) for n in kernel.nodes)
        for var in _output_lane_loops(kernel):  # lanes across the outputs instead
            try:  # rows stored along the lanes move lane by lane (a transposed store, in tiles)
                handler = CppVectorHandler(kernel, across_outputs=True, lane_loop=var, strided_loads=rows)
                return _node_statements(kernel, options, handler) + ("",)
            except NotVectorizable as exc:
                why += f"; nor across its outputs along {var}: {exc}"
        for var in _other_lane_loops(kernel):  # a transposed store: the lanes along another dim
            try:
                handler = CppVectorHandler(kernel, strided_loads=True, lane_loop=var)
                return _node_statements(kernel, options, handler) + ("",)
            except NotVectorizable:
                pass
    return _node_statements(kernel, options, CppHandler(kernel)) + (why,)


def _segmented_statements(kernel: Kernel, options: CppOptions) -> tuple[list[str], CppVectorHandler] | None:
    """A pointwise kernel's statements as vector code along its innermost loop split where
    clamped indices change branch (vector_segments.py), or None where that does not make every
    segment vector code. Returns all segments' statements and the last segment's handler, which
    holds them all in `lane_segments`."""
    extent = sympy.sympify(kernel.ranges[-1]) if kernel.ranges else None
    if not _pointwise_only(kernel) or extent is None or not extent.is_Integer:
        return None
    segments, found = [(0, int(extent))], None
    while True:
        done: list[tuple[int, int, list[str]]] = []
        points: set[int] = set()
        for lo, hi in segments:
            handler = CppVectorHandler(kernel, lane_range=(lo, hi))
            try:
                done.append((lo, hi, _node_statements(kernel, options, handler)[0]))
            except NotVectorizable:
                pass
            points |= handler.breakpoints
        if len(done) == len(segments):
            handler.lane_segments = done
            found = ([line for _, _, body in done for line in body], handler)
        finer = split_segments(segments, points)
        if finer == segments or len(finer) > MAX_SEGMENTS:  # splitting more decides nothing more, or too much code
            return found
        segments = finer


def _long_outer_loops(kernel: Kernel) -> list[sympy.Symbol]:
    """The kernel's outer loop variables that could be a vector loop (not known to be shorter
    than 4 iterations), innermost first."""
    found = []
    for var, extent in zip(index_vars(len(kernel.ranges)), kernel.ranges):
        extent = sympy.sympify(extent)
        if not (extent.is_Integer and int(extent) < 4):
            found.append(var)
    return found[::-1]


def _other_lane_loops(kernel: Kernel) -> list[sympy.Symbol]:
    """The outer loops of a pointwise kernel, other than the innermost one, that could be its
    vector loop (the loop order is free), innermost first."""
    if not _pointwise_only(kernel):
        return []
    innermost = index_vars(len(kernel.ranges))[-1]
    return [var for var in _long_outer_loops(kernel) if var != innermost]


def _output_lane_loops(kernel: Kernel) -> list[sympy.Symbol]:
    """The outer loops a kernel of reductions over outer dims (and pointwise nodes) may take as
    its vector loop, each lane reducing for its own output, innermost first. Any outer loop
    may: a channels-last `x.mean((0, 2, 3), keepdim=True)` iterates [1, C, 1, 1] outputs whose
    contiguous dim is not the last (the loops are reordered, the vector loop innermost). Row
    nodes run as scalar row loops around vector code (the backward of a linear layer: a bias
    gradient summed over dim 0 with the transposed gradient written as its rows); row
    temporaries, one scratch row per thread, hold one output's row, not a vector's."""
    if kernel.row_temporaries or not kernel.ranges or _single_outer_point(kernel):
        return []
    return _long_outer_loops(kernel)


def _why_scalar(kernel: Kernel, options: CppOptions) -> str:
    if not options.vectorize:
        return "vectorization is off (CppOptions.vectorize)"
    if _pointwise_only(kernel):
        if not kernel.ranges:
            return "no loop"
        extent = sympy.sympify(kernel.ranges[-1])
        if extent.is_Integer and int(extent) < 4:
            return f"the innermost loop has {extent} iterations"
    return ""


def openmp_loop_key(node: ComputedBuffer) -> tuple[bool]:
    """What scalar reductions sharing a loop (`kiln.loopir.codegen.shared_reduction_loops`) have
    alike besides their ranges: whether OpenMP clauses combine their accumulators. A scalar
    loop's clauses (the `simd` of a row, the threads of a kernel without outer loop) hold only
    when every accumulator has one, so reductions without (argmax/argmin, a bool max/min) keep
    loops apart from those with."""
    return (has_openmp_clauses(node.body.reduction_type, C_TYPES.get(node.body.dtype, "")),)


def _node_statements(kernel: Kernel, options: CppOptions, handler: CppHandler) -> tuple[list[str], CppHandler]:
    walker = KernelWalker(kernel, handler)
    loops = shared_reduction_loops(kernel, None if isinstance(handler, CppVectorHandler) else openmp_loop_key)
    joined = {node.name for nodes in loops.values() for node in nodes[1:]}  # emitted in the first's loop
    body: list[str] = []
    for node, kind in walker.nodes():
        if node.name in joined:
            continue
        if kind == "reduction":  # one with indirect indexing is in no shared loop: a loop of its own
            body += _reduction_lines(walker, loops.get(node.name, (node,)), options, _single_outer_point(kernel))
        else:
            body += _node_lines(walker, node, kind, options)
    return body, handler


@dataclasses.dataclass(frozen=True, slots=True)
class KernelSource:
    """One kernel's C++ definition and its run-time checks (empty: no `kiln_status` parameter)."""

    name: str
    text: str
    checks: tuple[CheckSite, ...]


def _signature(kernel: Kernel, checked: bool) -> list[str]:
    params = [f"const {storage_type(i.dtype)}* __restrict__ in_{i.name}" for i in kernel.inputs]
    params += [f"{storage_type(o.dtype)}* __restrict__ out_{o.name}" for o in kernel.outputs]
    params += [f"int64_t {s.name}" for s in kernel.symbols]
    if checked:
        params.append("int32_t* __restrict__ kiln_status")
    reads = ", ".join(i.name for i in kernel.inputs) or "nothing"
    writes = ", ".join(o.name for o in kernel.outputs)
    return [f"// {kernel.name}: reads {reads}; writes {writes}",
            f'extern "C" void {kernel.name}({", ".join(params)}) {{']


def _outer_loops(kernel: Kernel, handler: CppVectorHandler | None, body: list[str]
                 ) -> tuple[list[tuple[sympy.Symbol, sympy.Expr]], list[sympy.Symbol]]:
    """The outer loops to write, outermost first, with the vector loop (`handler.lane_loop`)
    innermost; and the variables of loops of one iteration, which are not loops (so the
    parallel loop is one that has iterations to share: the outputs of a channels-last
    `mean((0, 2, 3), keepdim=True)` are [1, C, 1, 1]) but constants where `body` uses them."""
    ivars = index_vars(len(kernel.ranges))
    loops = list(zip(ivars, kernel.ranges))
    if handler is not None and ivars and handler.lane_loop != ivars[-1]:  # the vector loop goes innermost
        lane = next(loop for loop in loops if loop[0] == handler.lane_loop)
        loops = [loop for loop in loops if loop is not lane] + [lane]
    text = "\n".join(body)
    units = [var for var, extent in loops if extent == 1]
    used = [var for var in units if re.search(rf"\b{var}\b", text)]
    return [loop for loop in loops if loop[0] not in units], used


def _outer_parallel_if(kernel: Kernel, options: CppOptions) -> str | None:
    """The outer loop's parallel `if` clause (see `parallel_if`); None: a serial loop."""
    if not options.openmp or _single_outer_point(kernel):
        return None
    inner = kernel.row_ranges or next((n.reduction_ranges for n in kernel.nodes if n.reduction_ranges), ())
    light = all(i.op in LIGHT_OPS for node in kernel.nodes for i in node.body.loop_body.instrs)
    return parallel_if((*kernel.ranges, *inner), options, light_parallel_threshold(options) if light else None)


def kernel_function(kernel: Kernel, options: CppOptions) -> KernelSource:
    """The C++ definition of one kernel."""
    body, handler, why_scalar = _kernel_body(kernel, options)
    # the innermost outer loop is vector code
    vector = isinstance(handler, CppVectorHandler)
    outer_vector_loop = vector and not why_scalar and (_pointwise_only(kernel) or handler.across_outputs)
    lines = _signature(kernel, bool(handler.checks))
    if why_scalar:
        lines.append(f"    // scalar loop: {why_scalar}")
    lines += indent(parallel_scan_lines(kernel, options), 1)  # returns when it ran
    lines += indent(parallel_scatter_lines(kernel, options), 1)  # returns when it ran
    if handler.checks:
        lines.append(f"    int32_t kiln_fail = 0;  // the failed run-time check (1..{len(handler.checks)}), 0: none")
    depth = 1
    pointwise = not any(isinstance(n.body, Reduction) for n in kernel.nodes)
    scratch = _scratch_lines(kernel)
    clause = _outer_parallel_if(kernel, options)
    # With a parallel outer loop, each thread gets its own scratch rows: a parallel region
    # declares them, then shares out the loop (`omp for`). Otherwise they are declared once.
    per_thread = bool(scratch) and clause is not None
    # Transposed reads (lane-strided loads): the loop around the vector loop goes by tiles of
    # TILE, and runs inside it, so a TILE x KILN_LANES block is read and written at a time.
    tiled = outer_vector_loop and handler.strided_loads
    loops, units = _outer_loops(kernel, handler if vector else None, body)
    lines += indent([f"constexpr int64_t {var} = 0;  // a loop of one iteration" for var in units], depth)
    segments = handler.lane_segments if outer_vector_loop else []
    if outer_vector_loop and _pointwise_only(kernel) and not tiled and not handler.checks and len(loops) > 1 \
            and not segments:
        prologue, body = hoist_lane_values(body, handler.definitions, handler.types, *loops[-1],
                                           [var for var, _ in loops[:-1]])
        lines += indent(prologue, depth)
    lines += indent(scratch if scratch and not per_thread else [], depth)
    for pos, (var, extent) in enumerate(loops):
        innermost = pos == len(loops) - 1
        if tiled and pos == len(loops) - 2:
            body = [f"for (int64_t {var} = {var}_tile; {var} < std::min<int64_t>({cpp_expr(extent)}, {var}_tile + "
                    f"{TILE}); ++{var}) {{", *indent(body, 1), "}"]
            var = sympy.Symbol(f"{var}_tile")
        # A pointwise loop that is not vector code is still marked simd (iterations are
        # independent); GCC may vectorize it, nothing relies on it.
        simd = pointwise and innermost and not outer_vector_loop
        if pos == 0 and clause is not None:
            construct = "parallel for simd" if simd else "parallel for"
            if per_thread:
                lines += indent([f"#pragma omp parallel{clause}", "{"], depth)
                depth += 1
                lines += indent(scratch + ["#pragma omp for"], depth)
            else:
                lines += indent([f"#pragma omp {construct}{clause}"], depth)
        elif simd:
            lines += indent(["#pragma omp simd"], depth)
        if innermost and outer_vector_loop:
            blocked = None
            if handler.across_outputs and not tiled and not handler.checks \
                    and not any(kernel.is_row(n) for n in kernel.nodes):
                blocked = blocked_vector_loop(var, extent, body)  # rows read a block of outputs at a time
            vector = segment_loops(var, segments) if segments else blocked or vector_loop(var, extent, body)
            lines += indent(vector, depth)
        elif tiled and pos == len(loops) - 2:
            lines += indent([f"for (int64_t {var} = 0; {var} < {cpp_expr(extent)}; {var} += {TILE}) {{"], depth)
            depth += 1
        else:
            lines += indent([loop(var, extent) + " {"], depth)
            depth += 1
    if not outer_vector_loop:
        lines += indent(body, depth)
    for d in range(depth - 1, 0, -1):
        lines += indent(["}"], d)
    if handler.checks:
        lines = _with_fail_reduction(lines)
        lines.append("    if (kiln_fail != 0) *kiln_status = kiln_fail;")
    lines.append("}")
    if isinstance(handler, CppVectorHandler):
        lines = with_stream_stores(kernel, lines)
    return KernelSource(kernel.name, "\n".join(lines), tuple(handler.checks))


def _with_fail_reduction(lines: list[str]) -> list[str]:
    """The loops of a checked kernel: OpenMP loops fold `kiln_fail` with max (each thread and
    simd lane keeps its own copy). A bare `omp simd` pragma is dropped instead: with the
    reduction clause, GCC no longer hoists loop-invariant work out of the loop (an embedding
    row's index check would run, and its row be gathered, per element: ~4x slower), while its
    own vectorizer handles the max reduction (libm calls in such loops stay scalar)."""
    out = []
    for line in lines:
        pragma = line.strip()
        if pragma == "#pragma omp simd":
            continue
        if pragma.startswith("#pragma omp parallel for simd"):
            line = line.replace("parallel for simd", "parallel for", 1)
        if pragma.startswith("#pragma omp ") and (" for" in pragma or " simd" in pragma):
            line += " reduction(max:kiln_fail)"
        out.append(line)
    return out


# Scalar loops (kernels that are not vector code) still rely on GCC's vectorizer:
# declaring the libm functions `omp declare simd` lets vectorized loops call libmvec's
# variants (_ZGVdN8v_expf, ...), which glibc itself only announces under -ffast-math.
LIBMVEC = ["", "// Vector variants of libm functions, from glibc's libmvec.", 'extern "C" {'] + [
    f"#pragma omp declare simd notinbranch\n{t} {name}{suffix}({t});"
    for name in ("exp", "log", "tanh", "erf", "expm1", "log1p")
    for t, suffix in (("float", "f"), ("double", ""))] + ["}", ""]


def kernel_graph_source(kernels: list[Kernel], options: CppOptions) -> tuple[str, dict[str, tuple[CheckSite, ...]]]:
    """One translation unit holding every kernel of a kernel graph, and each kernel's checks."""
    vector = VECTOR_LAYER + VECTOR_CONVERSIONS + VECTOR_MATH if options.vectorize else ""  # only what the kernels use
    prelude = PRELUDE + vector + ("\n".join(LIBMVEC) if options.vector_math else "")
    functions = [kernel_function(k, options) for k in kernels]
    text = "\n\n".join(f.text for f in functions)
    prelude += random_source.SOURCE if random_source.uses_random(text) else ""
    prelude += scan_source.SOURCE if scan_source.uses_scan(text) else ""
    source = prelude + "\n" + text + "\n"
    return source, {f.name: f.checks for f in functions}
