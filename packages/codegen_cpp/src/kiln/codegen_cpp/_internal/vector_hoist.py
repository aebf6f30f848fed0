"""Values of a pointwise kernel's vector loop that depend on the vector loop's variable alone,
computed once before the loop nest instead of at every point of the loops around it.

A channels-last batch norm, `relu((x - mean) * rsqrt(var + eps) * weight + bias)`, runs its
vector loop along C inside loops over N, H and W. `rsqrt(var + eps)` (and, in training, the
divisions that turn sums into the mean and variance) depend only on the channel, yet the body
computed them at every (n, h, w): a division and a square root per element cost more than the
kernel's memory traffic (measured: 3x a copy of the same tensor). GCC does not move them out,
since they vary along the vector loop. Here each such value is computed once per channel by a
vector loop of its own before the loop nest, into a small array, and the body loads it from
there; the statements that computed it become dead code in the body, which the compiler drops.
Same statements, same order of operations: the values are bit for bit those of the body.

It works on the statements `CppVectorHandler` emitted (`definitions`: variable -> expression, in
order), which are single assignments: a value depends on the lane only when its expression names
no other loop variable, no buffer the kernel writes and only values that depend on the lane only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sympy
import torch

from .printer import cpp_expr
from .vector_loops import vector_loop

# The element type of the array holding a hoisted vector value, by dtype (bfloat16/float16
# values are float32 lanes in registers); masks are not hoisted.
_ARRAY_TYPES = {torch.float32: "float", torch.float64: "double", torch.int32: "int32_t", torch.int64: "int64_t",
                torch.bfloat16: "float", torch.float16: "float"}
# At most this many elements per array (the arrays live on the stack of the calling thread).
MAX_LANE_EXTENT = 16384
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
_DEFINITION = re.compile(r"^(\s*)auto (\w+) = (.*);$")
_LOCAL = re.compile(r"^(tmp|inv)\d+$")  # the handler's variables
# Other variables a body may read (reduction accumulators and results, scratch rows, checks):
# never lane-only (the caller hoists in pointwise kernels only; this keeps it safe elsewhere).
_NOT_HOISTABLE = ("out_", "row_", "kiln_", "acc_", "vacc_", "vsum_", "sum_", "vresult_", "vnan_", "vat_",
                  "vbest_", "best_", "nan_", "partials_")
# Expressions as cheap to evaluate in the body as to load from an array.
_CHEAP = ("kiln::load(", "kiln::splat<", "kiln::ramp<", "static_cast<")


def _lane_only(definitions: dict[str, str], other_loops: set[str]) -> dict[str, bool]:
    """For each variable, whether its value depends on the vector loop's variable alone."""
    lane_only: dict[str, bool] = {}
    for name, text in definitions.items():
        words = set(_WORD.findall(text))
        lane_only[name] = not (words & other_loops) and all(
            lane_only.get(w, False) for w in words if _LOCAL.match(w)) and not any(
            w.startswith(_NOT_HOISTABLE) for w in words)
    return lane_only


def _roots(body: Sequence[str], definitions: dict[str, str], lane_only: dict[str, bool],
           types: dict[str, tuple[torch.dtype, bool]]) -> list[str]:
    """The values to hoist: lane-only vectors, more than a load, that a statement depending on
    the other loops uses."""
    roots: list[str] = []
    for line in body:
        match = _DEFINITION.match(line)
        if match and lane_only.get(match.group(2), False):
            continue
        for word in _WORD.findall(match.group(3) if match else line):
            if word in roots or not lane_only.get(word, False):
                continue
            dtype, vector = types.get(word, (None, False))
            if vector and dtype in _ARRAY_TYPES and not definitions[word].startswith(_CHEAP):
                roots.append(word)
    return roots


def _closure(roots: list[str], definitions: dict[str, str]) -> list[str]:
    """`roots` and every variable they are computed from, in definition order."""
    needed: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        needed.add(name)
        pending += [w for w in _WORD.findall(definitions[name]) if w in definitions]
    return [name for name in definitions if name in needed]


def _without_dead_definitions(body: list[str], lane_only: dict[str, bool]) -> list[str]:
    """`body` without the lane-only statements nothing reads any more (what computed a hoisted
    value), so the source shows what runs."""
    used: set[str] = set()
    kept: list[str] = []
    for line in reversed(body):
        match = _DEFINITION.match(line)
        if match and lane_only.get(match.group(2), False) and match.group(2) not in used:
            continue
        used.update(_WORD.findall(match.group(3) if match else line))
        kept.append(line)
    return kept[::-1]


def hoist_lane_values(body: list[str], definitions: dict[str, str], types: dict[str, tuple[torch.dtype, bool]],
                      lane_var: sympy.Symbol, extent: sympy.Expr, other_loops: Sequence[sympy.Symbol]
                      ) -> tuple[list[str], list[str]]:
    """(prologue, body): the statements computing the hoisted values before the loop nest (their
    arrays declared, then a vector loop over `extent` storing them), and `body` loading them.
    ([], body) when nothing is worth hoisting or the lane extent is not a small constant."""
    extent = sympy.sympify(extent)
    if not (extent.is_Integer and 0 < int(extent) <= MAX_LANE_EXTENT):
        return [], body
    lane_only = _lane_only(definitions, {str(v) for v in other_loops})
    roots = _roots(body, definitions, lane_only, types)
    if not roots:
        return [], body
    rewritten = []
    for line in body:
        match = _DEFINITION.match(line)
        if match and match.group(2) in roots:
            indent, name = match.group(1), match.group(2)
            line = f"{indent}auto {name} = kiln::load(lane_{name} + {lane_var}, active);  // computed before the loops"
        rewritten.append(line)
    rewritten = _without_dead_definitions(rewritten, lane_only)
    compute = [f"auto {name} = {definitions[name]};" for name in _closure(roots, definitions)]
    compute += [f"kiln::store(lane_{name} + {lane_var}, {name}, active);" for name in roots]
    arrays = [f"alignas(64) {_ARRAY_TYPES[types[name][0]]} lane_{name}[{cpp_expr(extent)}];" for name in roots]
    comment = f"// values that depend on {lane_var} alone, computed once for the loops below"
    return [comment, *arrays, *vector_loop(lane_var, extent, compute)], rewritten
