"""Graph breaks: the ``GraphBreak`` record and the hints that say what to do about one.

Dynamo reports a break as a reason text and a user stack. Since torch 2.7 the text is
structured (first line = kind of break, then ``Explanation:`` and ``Hint:`` lines); older
texts are one line. Both forms are accepted: ``reason`` is always the first line and
``detail`` the whole text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kiln.capture._internal.source import SourceLocation, innermost_user_frame

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GraphBreak:
    """One graph break: why Dynamo stopped the graph, where in user code, what to do.

    ``reason`` is Dynamo's one-line summary, ``location`` the innermost user frame (None when
    Dynamo gave none), ``hint`` a suggested fix (None when no rule matched), ``detail`` the
    full text Dynamo gave, and ``user_stack`` every user frame, outermost first.
    """

    reason: str
    location: SourceLocation | None
    hint: str | None = None
    detail: str = ""
    user_stack: tuple[SourceLocation, ...] = ()

    def __str__(self) -> str:
        where = f" at {self.location.short}" if self.location else ""
        return f"graph break{where}: {self.reason}"

    @property
    def explanation(self) -> str | None:
        """The ``Explanation:`` line of Dynamo's text, when it has one."""
        for line in self.detail.splitlines():
            stripped = line.strip()
            if stripped.startswith("Explanation:"):
                return stripped.removeprefix("Explanation:").strip()
        return None


@dataclass(frozen=True, slots=True)
class BreakHintRule:
    """A hint given when ``pattern`` matches the break's text or its code line."""

    name: str
    pattern: str
    hint: str

    def matches(self, text: str) -> bool:
        return re.search(self.pattern, text, flags=re.IGNORECASE) is not None


#: Rules tried in order; the first match gives the hint. More specific causes come first.
DEFAULT_HINT_RULES: tuple[BreakHintRule, ...] = (
    BreakHintRule(
        "print",
        r"`print`|builtin print|^\s*print\(",
        "remove the print, or move it into a function marked torch.compiler.disable "
        "(or list it in torch._dynamo.config.reorderable_logging_functions)",
    ),
    BreakHintRule(
        "logging",
        r"\blogging\.\w+|\blogger\.\w+|warnings\.warn",
        "logging calls break the graph: move them out of the compiled function or list them "
        "in torch._dynamo.config.reorderable_logging_functions",
    ),
    BreakHintRule(
        "data-dependent control flow",
        r"generic_jump|data.dependent (branch|control|jump)|^\s*(if|elif|while)\b.*\b(sum|any|all|max|min|item)\(",
        "data-dependent control flow: use torch.where for element-wise choices or torch.cond "
        "for branches, instead of a Python `if` on a tensor value",
    ),
    BreakHintRule(
        "scalar output",
        r"\.item\(|capture_scalar_outputs",
        "Tensor.item() leaves the graph: keep the value as a tensor, or set "
        "torch._dynamo.config.capture_scalar_outputs = True",
    ),
    BreakHintRule(
        "dynamic output shape",
        r"dynamic.output.shape|nonzero|capture_dynamic_output_shape_ops",
        "an op whose output shape depends on data: set "
        "torch._dynamo.config.capture_dynamic_output_shape_ops = True, or avoid the op",
    ),
    BreakHintRule(
        "tolist / numpy",
        r"\.tolist\(|\.numpy\(|numpy\.ndarray",
        "converting to Python lists or NumPy leaves the graph: keep the data as tensors",
    ),
    BreakHintRule(
        "disabled function",
        r"compiler\.disable|_dynamo\.disable|disable\(\)d",
        "the call is marked torch.compiler.disable: remove the marker if the function is "
        "traceable, or accept the break",
    ),
    BreakHintRule(
        "skipped function",
        r"marked as skipped|skipfiles|in skip_files|skip list",
        "Dynamo does not trace this library function: wrap it as a custom op "
        "(torch.library.custom_op) so it stays in the graph as one node",
    ),
    BreakHintRule(
        "loop",
        r"graph break in (a for/while )?loop|skipping (the )?frame|frame skipped",
        "a graph break inside a loop makes Dynamo run the whole function eagerly: move the "
        "breaking call out of the loop",
    ),
)

_UNHELPFUL_TORCH_HINTS = ("report an issue", "file an issue")


def hint_for(detail: str, code_line: str, rules: Sequence[BreakHintRule]) -> str | None:
    """The first rule's hint matching the break text or code line, else Dynamo's own hint."""
    for rule in rules:
        if rule.matches(detail) or (code_line and rule.matches(code_line)):
            return rule.hint
    for line in detail.splitlines():
        stripped = line.strip()
        if stripped.startswith("Hint:") and not any(
            phrase in stripped.lower() for phrase in _UNHELPFUL_TORCH_HINTS
        ):
            return stripped.removeprefix("Hint:").strip()
    return None


def make_break(
    detail: str,
    user_stack: Sequence[SourceLocation],
    rules: Sequence[BreakHintRule] = DEFAULT_HINT_RULES,
    fallback_location: SourceLocation | None = None,
) -> GraphBreak:
    """Build a ``GraphBreak`` from Dynamo's reason text and the user frames, outermost first."""
    reason = next((line.strip() for line in detail.splitlines() if line.strip()), "unknown")
    location = innermost_user_frame(user_stack) or fallback_location
    code_line = location.code_line if location else ""
    return GraphBreak(
        reason=reason,
        location=location,
        hint=hint_for(detail, code_line, rules),
        detail=detail,
        user_stack=tuple(user_stack),
    )


def break_from_compile_reason(compile_reason: object) -> GraphBreak | None:
    """Convert Dynamo's ``GraphCompileReason`` (duck-typed), or None if it is not a break."""
    if compile_reason is None or not getattr(compile_reason, "graph_break", False):
        return None
    detail = str(getattr(compile_reason, "reason", "") or "")
    frames = getattr(compile_reason, "user_stack", None) or ()
    try:
        stack = [SourceLocation.from_frame(frame) for frame in frames]
    except (AttributeError, TypeError):
        log.debug("unexpected user_stack entries in %r; location dropped", compile_reason)
        stack = []
    return make_break(detail, stack)


def unique_breaks(breaks: Iterable[GraphBreak]) -> list[GraphBreak]:
    """Drop repeats of the same break at the same line, keeping first-seen order.

    Dynamo reports a break inside an inlined helper twice: once for the calling frame, once
    when it compiles the helper's own frame. The user has one line to fix.
    """
    seen: set[tuple[str, str, int]] = set()
    kept: list[GraphBreak] = []
    for graph_break in breaks:
        loc = graph_break.location
        key = (graph_break.reason, loc.filename if loc else "", loc.lineno if loc else -1)
        if key not in seen:
            seen.add(key)
            kept.append(graph_break)
    return kept
