"""Recompilations: which guard failed, where the guarded value came from, what to do.

Dynamo records one ``CompilationMetrics`` per frame compile
(``torch._dynamo.utils.get_compilation_metrics()``); a recompile carries
``recompile_reason``, the first failed guard of the latest compiled entry, in the form
``"0/0: tensor 'x' size mismatch at index 0. expected 3, actual 5"`` or, for a guard on a
Python value, ``"0/1: n == 2  # code  # file:line in f"`` followed by a ``User stack
trace:`` of the line that made Dynamo guard on it. A compile that hit the recompile limit
carries ``fail_type``/``fail_reason`` too: Dynamo gave up and the function runs eagerly.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kiln.capture._internal.breaks import BreakHintRule
from kiln.capture._internal.source import (
    SourceLocation,
    innermost_user_frame,
    parse_stack_trace,
    read_line,
)

log = logging.getLogger(__name__)

_ENTRY = re.compile(r"^(?P<entry>\d+/\d+(?:_\d+)?): (?P<text>.*)$")
_COMMENT = re.compile(r"\s{2,}#\s")


@dataclass(frozen=True, slots=True)
class Recompile:
    """One recompilation of a function Dynamo had compiled before.

    ``compile_id`` is the new compile (``"0/1"``), ``function`` the ``def`` line of the
    recompiled function, ``guard`` the guard that failed as Dynamo states it
    (``tensor 'x' dtype mismatch. expected Float, actual Double``), ``failed_entry`` the
    earlier compile whose guard failed (``"0/0"``), ``location`` the user line that made
    Dynamo guard on that value (when Dynamo records one), ``hint`` what to do,
    ``detail`` Dynamo's full text, and ``gave_up`` whether Dynamo hit its recompile limit
    and runs the function eagerly from then on.
    """

    compile_id: str
    function: SourceLocation | None
    guard: str
    failed_entry: str | None = None
    location: SourceLocation | None = None
    hint: str | None = None
    detail: str = ""
    gave_up: bool = False

    def __str__(self) -> str:
        name = self.function.display_function if self.function else "?"
        where = f" ({self.function.short})" if self.function else ""
        outcome = "gave up recompiling" if self.gave_up else f"recompiled as {self.compile_id}"
        return f"{name}{where} {outcome}: {self.guard}"


#: Rules tried in order on the guard text; the first match gives the hint.
DEFAULT_RECOMPILE_HINT_RULES: tuple[BreakHintRule, ...] = (
    BreakHintRule(
        "size",
        r"size mismatch|size\(\)\[\d+\] ==",
        "an input's size changed. Dynamo recompiles once with dynamic shapes (automatic "
        "dynamic); to start dynamic, mark the dimension with torch._dynamo.mark_dynamic(x, dim) "
        "or compile with dynamic=True (dynamic=False recompiles for every new size)",
    ),
    BreakHintRule(
        "dtype",
        r"dtype mismatch",
        "an input's dtype changed and each dtype needs its own graph: cast inputs to one "
        "dtype before the call if this recompile is unwanted",
    ),
    BreakHintRule(
        "rank",
        r"rank mismatch|dim(ension)?s? mismatch",
        "an input's number of dimensions changed; each rank needs its own graph",
    ),
    BreakHintRule(
        "requires_grad",
        r"requires_grad mismatch",
        "an input's requires_grad changed (training vs inference inputs): each needs its own "
        "graph; call with the same kind of inputs, or under torch.no_grad() every time",
    ),
    BreakHintRule(
        "stride",
        r"stride mismatch|strides?\(\)",
        "an input's memory layout changed (a transposed or sliced tensor): pass "
        "x.contiguous() if the layout does not matter",
    ),
    BreakHintRule(
        "device",
        r"device mismatch",
        "an input moved to another device; each device needs its own graph",
    ),
    BreakHintRule(
        "global state",
        r"GLOBAL_STATE|grad_mode|autocast",
        "global state changed between calls (grad mode, autocast, default dtype, ...): each "
        "state has its own graph; keep the state the same around the compiled call",
    ),
    BreakHintRule(
        "object identity",
        r"___check_obj_id|ID_MATCH|id\(",
        "a different object (module, function or global) was used; Dynamo specializes on "
        "object identity: reuse the same object, or pass the data as tensors",
    ),
    BreakHintRule(
        "python type",
        r"___check_type_id|TYPE_MATCH|type mismatch",
        "an argument's Python type changed; keep argument types stable",
    ),
    BreakHintRule(
        "length",
        r"len\(",
        "a list, tuple or dict argument changed length; Dynamo unrolls containers by length",
    ),
    BreakHintRule(
        "bool value",
        r"== (True|False)\b|\bis (True|False)\b",
        "a bool argument or global changed, and Dynamo specializes on bools: each value gets "
        "its own graph; pass it as a tensor (and use torch.where) if it varies per call",
    ),
    BreakHintRule(
        "number value",
        r"== -?\d+(\.\d+)?(e-?\d+)?\s*$",
        "a Python number changed, and the graph was specialized on its value: an int becomes "
        "symbolic after this one recompile (automatic dynamic); a float that varies is better "
        "passed as a tensor",
    ),
    BreakHintRule(
        "python value",
        r"==|\bis\b",
        "the graph was specialized on a Python value that changed (shown in the guard): pass "
        "it as a tensor if it varies",
    ),
)

_GAVE_UP_HINT = (
    "Dynamo reached torch._dynamo.config.recompile_limit and now runs this function "
    "eagerly: remove the cause of the recompiles above, or raise the limit"
)


def recompiles_from_metrics(metrics: Iterable[Any]) -> list[Recompile]:
    """``Recompile`` records from Dynamo's compilation metrics, in compile order."""
    metrics = [m for m in metrics if getattr(m, "is_forward", None) is not False]
    functions = _functions_by_frame(metrics)
    recompiles = []
    for metric in metrics:
        reason = getattr(metric, "recompile_reason", None)
        if not reason:
            continue
        compile_id = str(getattr(metric, "compile_id", None) or "?")
        function = _function_of(metric) or functions.get(_frame(compile_id))
        gave_up = "recompile limit" in str(getattr(metric, "fail_reason", "") or "").lower()
        recompiles.append(parse_recompile(compile_id, function, reason, gave_up))
    return recompiles


def parse_recompile(
    compile_id: str,
    function: SourceLocation | None,
    reason: str,
    gave_up: bool = False,
    rules: Iterable[BreakHintRule] = DEFAULT_RECOMPILE_HINT_RULES,
) -> Recompile:
    """Build a ``Recompile`` from Dynamo's reason text (see the module docstring)."""
    lines = reason.splitlines()
    first = lines[0] if lines else reason
    match = _ENTRY.match(first)
    failed_entry, text = (match["entry"], match["text"]) if match else (None, first)
    guard = _COMMENT.split(text, maxsplit=1)[0].strip()
    location = None
    if "User stack trace:" in reason:
        trace = reason.split("User stack trace:", 1)[1]
        location = innermost_user_frame(parse_stack_trace(trace))
    hint = next((rule.hint for rule in rules if rule.matches(guard)), None)
    if gave_up:
        hint = f"{_GAVE_UP_HINT}. The last guard: {hint}" if hint else _GAVE_UP_HINT
    return Recompile(
        compile_id=compile_id,
        function=function,
        guard=guard or text,
        failed_entry=failed_entry,
        location=location,
        hint=hint,
        detail=reason,
        gave_up=gave_up,
    )


def compilation_metrics() -> list[Any]:
    """Dynamo's compilation metrics so far (empty if this torch version has none)."""
    getter = getattr(torch._dynamo.utils, "get_compilation_metrics", None)
    if getter is None:
        log.debug("torch._dynamo.utils.get_compilation_metrics is missing; no recompiles")
        return []
    return list(getter())


def _function_of(metric: Any) -> SourceLocation | None:
    name = getattr(metric, "co_name", None)
    filename = getattr(metric, "co_filename", None)
    lineno = getattr(metric, "co_firstlineno", None)
    if not (name and filename and lineno):
        return None
    return SourceLocation(filename, int(lineno), name, read_line(filename, int(lineno)))


def _functions_by_frame(metrics: list[Any]) -> Mapping[str, SourceLocation]:
    functions: dict[str, SourceLocation] = {}
    for metric in metrics:
        location = _function_of(metric)
        if location is not None:
            functions.setdefault(_frame(str(getattr(metric, "compile_id", ""))), location)
    return functions


def _frame(compile_id: str) -> str:
    return compile_id.split("/")[0]
