"""Where captured code came from: ``SourceLocation`` and the parsers that build it.

Dynamo and torch.export both describe user code as traceback frames: Dynamo's graph-break
reasons carry ``traceback.FrameSummary`` lists, and every traced node carries a
``meta["stack_trace"]`` text in traceback format. Both are turned into the same small record.
"""

from __future__ import annotations

import linecache
import logging
import os
import re
import traceback
import types
from collections.abc import Sequence
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

# Frames in these directories are library code, never the user's: torch itself, and this
# package (export mode calls the user's function from a wrapper module).
_LIBRARY_DIRS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)
_FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
# Python 3.11+ underlines the failing expression with ^ and ~ markers; they are not code.
_MARKER_LINE = re.compile(r"^\s*[\^~]+\s*$")
# Dynamo compiles the code after a graph break as a new function named like this.
_RESUME_NAME = re.compile(r"torch_dynamo_resume_in_(?P<func>\w+?)_at_(?P<line>\d+)")


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """A line of user source code.

    ``filename`` is the path as Python reported it, ``lineno`` is 1-based, ``function`` is the
    name of the code object (Dynamo names resumed code ``torch_dynamo_resume_in_<fn>_at_<n>``),
    and ``code_line`` is the stripped source text ("" when the file cannot be read).
    """

    filename: str
    lineno: int
    function: str
    code_line: str = ""

    def __str__(self) -> str:
        where = f"{self.filename}:{self.lineno} in {self.display_function}"
        return f"{where}: {self.code_line}" if self.code_line else where

    @property
    def display_function(self) -> str:
        """The function name, with Dynamo's resume functions shown as the user's function."""
        match = _RESUME_NAME.fullmatch(self.function)
        if match is None:
            return self.function
        return f"{match['func']} (resumed after line {match['line']})"

    @property
    def short(self) -> str:
        """``basename:lineno``, for one-line summaries."""
        return f"{os.path.basename(self.filename)}:{self.lineno}"

    @classmethod
    def from_frame(cls, frame: traceback.FrameSummary) -> SourceLocation:
        """Build from a ``traceback.FrameSummary`` (as found in Dynamo's ``user_stack``)."""
        lineno = frame.lineno or 0
        code_line = (frame.line or "").strip() or read_line(frame.filename, lineno)
        return cls(frame.filename, lineno, frame.name, code_line)

    @classmethod
    def from_code(cls, code: types.CodeType) -> SourceLocation:
        """The ``def`` line of a code object."""
        lineno = code.co_firstlineno
        return cls(code.co_filename, lineno, code.co_name, read_line(code.co_filename, lineno))


def read_line(filename: str, lineno: int) -> str:
    return linecache.getline(filename, lineno).strip() if lineno > 0 else ""


def is_library_frame(location: SourceLocation) -> bool:
    """True when the location is inside torch or kiln.capture, not user code."""
    return os.path.abspath(location.filename).startswith(_LIBRARY_DIRS)


def parse_stack_trace(text: str) -> list[SourceLocation]:
    """Parse a ``node.meta["stack_trace"]`` text into locations, outermost frame first."""
    frames: list[SourceLocation] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = _FRAME_LINE.match(line)
        if match is None:
            continue
        lineno = int(match["line"])
        code_line = ""
        if i + 1 < len(lines) and not _FRAME_LINE.match(lines[i + 1]):
            candidate = lines[i + 1].strip()
            if candidate and not _MARKER_LINE.match(candidate):
                code_line = candidate
        if not code_line:
            code_line = read_line(match["file"], lineno)
        frames.append(SourceLocation(match["file"], lineno, match["func"], code_line))
    return frames


def outermost_user_frame(frames: Sequence[SourceLocation]) -> SourceLocation | None:
    """The outermost user frame (the function that was compiled), or None if all are library."""
    return next((frame for frame in frames if not is_library_frame(frame)), None)


def innermost_user_frame(frames: Sequence[SourceLocation]) -> SourceLocation | None:
    """The innermost user frame (where a break happened), else the innermost."""
    for frame in reversed(frames):
        if not is_library_frame(frame):
            return frame
    return frames[-1] if frames else None


def graph_source(
    gm: torch.fx.GraphModule, fallback: SourceLocation | None = None
) -> SourceLocation | None:
    """The user code a graph starts at: the first computing node with a user frame.

    Placeholders come last in the search because Dynamo gives them the trace of their
    first use, which is less precise than the first operation's own trace. torch.export
    records only ``forward`` frames, so a graph traced through a wrapper may have no user
    frame at all; ``fallback`` is returned then.
    """
    nodes = list(gm.graph.nodes)
    ordered = [n for n in nodes if n.op not in ("placeholder", "output")]
    ordered += [n for n in nodes if n.op == "placeholder"]
    for node in ordered:
        text = node.meta.get("stack_trace")
        if isinstance(text, str) and text:
            location = outermost_user_frame(parse_stack_trace(text))
            if location is not None:
                return location
    log.debug("no node has a user frame in its stack_trace; using %s", fallback)
    return fallback


def code_location(fn: object) -> SourceLocation | None:
    """The ``def`` line of a function, or of an ``nn.Module``'s ``forward``; None if unknown."""
    target = getattr(fn, "forward", fn)
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    return SourceLocation.from_code(code) if isinstance(code, types.CodeType) else None
