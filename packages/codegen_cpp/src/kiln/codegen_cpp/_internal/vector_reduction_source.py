"""Vector reductions: accumulators of KILN_LANES lanes, `PARTS` of them per reduction.

A reduction loop in vector code (`function_source.vector_reduction_loop`) handles PARTS
vectors per iteration, each into its own accumulator (`vacc_<buffer>[part]`), so PARTS
dependency chains run side by side instead of one (an add or a compare-select has a latency
of several cycles, a throughput of one or two per cycle). After the loop the parts are folded
as a tree, then the lanes of the result as a tree (`kiln::reduce_*`).

Semantics are the scalar loops' (`reduction_source.py`), except that a float32 sum adds in
float32 lanes, the PARTS partials moved (folded as a tree) into a total every FLUSH_BLOCKS
iterations and after the loop (`vector_loops.vector_reduction_loop`), so a partial's lane adds
at most FLUSH_BLOCKS values and the hot loop has no conversion. Its accuracy, u = 2**-24 (stated
and tested in `tests/test_codegen_cpp_vector.py`):

* a long row (more than SHORT_ROW values per lane), a symbolic length, or several reduction
  dims: a float64 total (`kiln::vf64x2`), folded in float64 and rounded to float once. Each
  value goes through at most FLUSH_BLOCKS + 2 float32 additions (its partial, the tree of the
  parts), so |error| <= (FLUSH_BLOCKS + 2) * u * sum(|x|) + the final rounding, whatever the
  length (a large value then ones: at most FLUSH_BLOCKS + PARTS - 1 ones lost).
* a short row (one reduction dim of static length n <= SHORT_ROW * KILN_LANES, decided in C++
  per ISA: `kiln::sum_total<(n <= SHORT_ROW * KILN_LANES)>`): a float32 total, folded in
  float32 (the float64 conversions and fold cost 10-15% of an rmsnorm over rows of 1024). A
  value goes through at most FLUSH_BLOCKS + 2 + (SHORT_ROW / (PARTS * FLUSH_BLOCKS) + 1) +
  log2(KILN_LANES) = 19 + log2(KILN_LANES) <= 23 float32 additions (partial, parts, total,
  lanes), so |error| <= 23 * u * sum(|x|) (about 1.4e-6 * sum(|x|)), whatever the values.
  Split across threads (`vector_loops.split_reduction_lines`), each chunk's sum is so bounded
  and the chunks' float64 combination is rounded once more. Like eager's float32 sum, its lanes
  may overflow where a float64 total would not (a cancelling sum of values near the maximum).

Sums over outer dims (`start_lanewise_reduction`: one output per lane, no lane fold) keep
their float64 total whatever the length: its cost, one conversion per LANEWISE_RUN values and
one narrowing per KILN_LANES outputs, is not a fold per row.

max/min note NaNs in a mask, and any NaN makes the result NaN; argmax/argmin keep, per
lane, the best value and its position (a strictly better value, or the first NaN, replaces
them), and the folds break ties by the lower position, so the result is eager's first index
(the first NaN's, when there is one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .reduction_source import PendingReduction, lowest_first

PARTS = 4
# A float32 row sum whose lanes each add at most this many values keeps a float32 total (see
# above); MAX_LANES is the widest ISA's KILN_LANES (AVX-512), past which no ISA's row is short.
SHORT_ROW = 256
MAX_LANES = 16
_FLOATS = ("float", "double")
# The vector type of an accumulator, by the C++ type of the value reduced.
_ACCUMULATORS = {"float": "kiln::vf32", "double": "kiln::vf64", "int64_t": "kiln::vi64", "int32_t": "kiln::vi32",
                 "bool": "kiln::vmask"}


def _parts(name: str) -> list[str]:
    return [f"{name}[{k}]" for k in range(PARTS)]


def _tree(combine: str, values: list[str]) -> str:
    """`values` folded pairwise as a balanced tree; `combine` formats two operands."""
    while len(values) > 1:
        values = [combine.format(values[k], values[k + 1]) for k in range(0, len(values), 2)]
    return values[0]


def _declare(vector: str, name: str, init: str) -> str:
    return f"{vector} {name}[{PARTS}] = {{{', '.join([init] * PARTS)}}};"


def _float32_sum(name: str, value: str, length: int | None) -> PendingReduction:
    """A float32 sum: float32 accumulators, their partial sums moved into a total every
    FLUSH_BLOCKS iterations and after the loop, so a float32 partial adds up at most
    FLUSH_BLOCKS values (one add per element in the hot loop, no conversion). The total is
    float64 (`kiln::vf64x2`, two registers) unless the row is short (`length`, a static
    length, at most SHORT_ROW values per lane; None: unknown or several dims): then C++ picks
    float32 lanes on the ISAs whose KILN_LANES make it short. The result is rounded to float."""
    acc, vacc, total = f"acc_{name}", f"vacc_{name}", f"vtotal_{name}"
    partials = _tree('({} + {})', _parts(vacc))
    if length is None or length > SHORT_ROW * MAX_LANES:
        declare_total = f"kiln::vf64x2 {total} = {{}};"
        add = f"{total} = {total} + kiln::widen2({partials});"
    else:
        short = f"{length} <= {SHORT_ROW} * KILN_LANES"
        declare_total = (f"kiln::sum_total<({short})> {total} = {{}};  // float32 if {short} (a short row: "
                         f"few roundings a lane), else float64")
        add = f"{total} = kiln::add_partials({total}, {partials});"
    flush = (add, " = ".join(_parts(vacc)) + " = kiln::vf32{};")
    finish = (f"auto {acc} = kiln::reduce_add({total});", f"float sum_{name} = static_cast<float>({acc});")
    declarations = (_declare("kiln::vf32", vacc, "kiln::vf32{}"), declare_total)
    update = (f"{vacc}[part] = {vacc}[part] + kiln::active_or({value}, 0, active);",)
    return PendingReduction("sum", declarations, update, finish, "", f"sum_{name}", acc, "double", 1, "({} + {})",
                            flush)


def _sum_or_product(name: str, reduction_type: str, ctype: str, value: str, length: int | None) -> PendingReduction:
    if ctype == "float" and reduction_type == "sum":
        return _float32_sum(name, value, length)
    acc, vacc = f"acc_{name}", f"vacc_{name}"
    vector = _ACCUMULATORS[ctype]
    identity, op = ("0", "+") if reduction_type == "sum" else ("1", "*")
    element = f"kiln::active_or({value}, {identity}, active)"
    finish = [f"auto {acc} = kiln::reduce_{'add' if op == '+' else 'mul'}({_tree('({} ' + op + ' {})', _parts(vacc))});"]
    return PendingReduction(reduction_type, (_declare(vector, vacc, f"kiln::splat<{vector}>({identity})"),),
                            (f"{vacc}[part] = {vacc}[part] {op} {element};",), tuple(finish), "", acc,
                            acc, ctype, 1, f"({{}} {op} {{}})")


def _extremum(name: str, reduction_type: str, ctype: str, value: str) -> PendingReduction:
    acc, vacc = f"acc_{name}", f"vacc_{name}"
    vector = _ACCUMULATORS[ctype]
    init = lowest_first(reduction_type, ctype)
    if ctype == "bool":  # any / all
        op = "|" if reduction_type == "max" else "&"
        fill = "0" if reduction_type == "max" else "-1"
        update = [f"{vacc}[part] = {vacc}[part] {op} kiln::active_or({value}, {fill}, active);"]
        finish = [f"bool {acc} = kiln::reduce_{'or' if op == '|' else 'and'}({_tree('({} ' + op + ' {})', _parts(vacc))}) != 0;"]
        return PendingReduction(reduction_type, (_declare(vector, vacc, f"kiln::splat<kiln::vmask>({fill})"),),
                                tuple(update), tuple(finish), "", acc, acc, "bool", 1, f"({{}} {op}{op} {{}})")
    # A compare-select per lane, NaNs noted apart (a short dependency chain).
    compare = ">" if reduction_type == "max" else "<"
    element = f"vnext_{name}"
    update = [f"auto {element} = kiln::active_or({value}, {init}, active);",
              f"{vacc}[part] = {element} {compare} {vacc}[part] ? {element} : {vacc}[part];"]
    declarations = [_declare(vector, vacc, f"kiln::splat<{vector}>({init})")]
    pick = "kiln::" + ("larger" if reduction_type == "max" else "smaller") + "({}, {})"
    finish = [f"{ctype} {acc} = kiln::reduce_{reduction_type}({_tree(pick, _parts(vacc))});"]
    if ctype in _FLOATS:
        nan = f"vnan_{name}"
        declarations.append(_declare("kiln::vmask", nan, "kiln::vmask{}") + "  // lanes that saw a NaN")
        update.append(f"{nan}[part] = {nan}[part] | kiln::mask({element} != {element});")
        finish.append(f"if (kiln::any({_tree('({} | {})', _parts(nan))})) {acc} = std::numeric_limits<{ctype}>::quiet_NaN();")
    return PendingReduction(reduction_type, tuple(declarations), tuple(update), tuple(finish), "", acc, acc, ctype,
                            len(finish), f"kiln_{reduction_type}({{}}, {{}})")


def _arg_extremum(name: str, reduction_type: str, ctype: str, value: str, position: str) -> PendingReduction:
    best, at, acc = f"vbest_{name}", f"vat_{name}", f"acc_{name}"
    vector = _ACCUMULATORS[ctype]
    largest = "true" if reduction_type == "argmax" else "false"
    init = lowest_first(reduction_type, ctype)
    declarations = (_declare(vector, best, f"kiln::splat<{vector}>({init})"),
                    _declare("kiln::vi64", at, "kiln::vi64{}"))
    # inactive lanes (a tail) hold the worst value: they never replace a lane's best
    update = (f"kiln::arg_update<{largest}>({best}[part], {at}[part], kiln::active_or({value}, {init}, active), "
              f"{position});",)
    finish = [f"for (int part = 1; part < {PARTS}; ++part) "
              f"kiln::arg_combine<{largest}>({best}[0], {at}[0], {best}[part], {at}[part]);",
              f"int64_t {acc} = kiln::arg_fold<{largest}>({best}[0], {at}[0]);"]
    return PendingReduction(reduction_type, declarations, update, tuple(finish), "", acc)


def start_vector_reduction(name: str, reduction_type: str, ctype: str, value: str | tuple[str, str],
                           body: Sequence[str], length: int | None = None) -> PendingReduction | None:
    """`reduction_source.start_reduction` for vector values (KILN_LANES elements, `active` of
    them real; for argmax/argmin a pair of vectors: values and their int64 positions): the
    accumulators (PARTS arrays), the loop body (the statements of `body`, then the update of
    accumulator `part`) and the folds after the loop. `length`: the reduction's length where it
    is one static dim (a float32 sum's total depends on it), else None. None when this
    reduction has no vector version."""
    pending = None
    if reduction_type in ("argmax", "argmin") and ctype in _ACCUMULATORS and ctype != "bool":
        pending = _arg_extremum(name, reduction_type, ctype, *value)
    elif isinstance(value, tuple):
        return None
    elif reduction_type in ("sum", "prod") and ctype in _ACCUMULATORS and ctype != "bool":
        pending = _sum_or_product(name, reduction_type, ctype, value, length)
    elif reduction_type in ("max", "min") and ctype in _ACCUMULATORS:
        pending = _extremum(name, reduction_type, ctype, value)
    if pending is None:
        return None
    return dataclasses.replace(pending, body=(*body, *pending.body))


def start_lanewise_reduction(name: str, reduction_type: str, ctype: str, value: str | tuple[str, str],
                             body: Sequence[str]) -> PendingReduction | None:
    """A reduction whose lanes are KILN_LANES different outputs (a reduction over an outer
    dim, vectorized across the contiguous output dim): one accumulator vector, no fold; the
    result is a vector (`result`, one value per output). A float32 sum adds runs of at most
    LANEWISE_RUN (reduction_source.py) values in float32 lanes, each moved into a float64 total (`flush`, which
    `reduction_lines` runs after each run of the innermost loop). None when it has no vector
    version."""
    if ctype not in _ACCUMULATORS or (reduction_type in ("sum", "prod", "argmax", "argmin") and ctype == "bool"):
        return None
    vacc, vector = f"vacc_{name}", _ACCUMULATORS[ctype]
    if reduction_type in ("argmax", "argmin"):
        if not isinstance(value, tuple):
            return None
        at, largest = f"vat_{name}", "true" if reduction_type == "argmax" else "false"
        declarations = (f"{vector} {vacc} = kiln::splat<{vector}>({lowest_first(reduction_type, ctype)});",
                        f"kiln::vi64 {at} = {{}};")
        update = f"kiln::arg_update<{largest}>({vacc}, {at}, {value[0]}, {value[1]});"
        return PendingReduction(reduction_type, declarations, (*body, update), (), "", at)
    if isinstance(value, tuple):
        return None
    finish: list[str] = []
    result = vacc
    flush: tuple[str, ...] = ()
    if ctype == "float" and reduction_type == "sum":
        total, result = f"vtotal_{name}", f"vsum_{name}"
        # float32 lanes over a run of the innermost loop, then into the float64 total (two registers)
        declarations = [f"kiln::vf64x2 {total} = {{}};", f"kiln::vf32 {vacc} = {{}};"]
        update = [f"{vacc} = {vacc} + {value};"]
        flush = (f"{total} = {total} + kiln::widen2({vacc});", f"{vacc} = kiln::vf32{{}};")
        finish.append(f"kiln::vf32 {result} = kiln::narrow({total});")
    elif reduction_type in ("sum", "prod"):
        op = "+" if reduction_type == "sum" else "*"
        declarations = [f"{vector} {vacc} = kiln::splat<{vector}>({'0' if op == '+' else '1'});"]
        update = [f"{vacc} = {vacc} {op} {value};"]
    elif ctype == "bool":
        op = "|" if reduction_type == "max" else "&"
        declarations = [f"kiln::vmask {vacc} = kiln::splat<kiln::vmask>({'0' if op == '|' else '-1'});"]
        update = [f"{vacc} = {vacc} {op} {value};"]
    else:
        compare = ">" if reduction_type == "max" else "<"
        declarations = [f"{vector} {vacc} = kiln::splat<{vector}>({lowest_first(reduction_type, ctype)});"]
        update = [f"{vacc} = {value} {compare} {vacc} ? {value} : {vacc};"]
        if ctype in _FLOATS:
            nan = f"vnan_{name}"
            declarations.append(f"kiln::vmask {nan} = {{}};  // outputs that saw a NaN")
            update.append(f"{nan} = {nan} | kiln::mask({value} != {value});")
            result = f"vresult_{name}"
            finish.append(f"auto {result} = kiln::select({nan}, kiln::splat<{vector}>(NAN), {vacc});")
    return PendingReduction(reduction_type, tuple(declarations), (*body, *update), tuple(finish), "", result,
                            flush=flush)
