"""``Capture.to_html``: one self-contained page (inline CSS, no scripts, no network).

Sections: a summary; the graph breaks (red) and recompiles (amber), each linked to its
source line; every graph as the Python code FX generates for it, each line linked to the
user source line its node came from; and excerpts of the user's files around every line
referred to, with break and recompile lines highlighted. Links between sections are page
anchors, so the page works offline; each file heading also links to the file itself.
"""

from __future__ import annotations

import html
import linecache
import logging
import re
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.recompiles import Recompile
from kiln.capture._internal.report import graphs_of, inputs_summary, plural
from kiln.capture._internal.source import SourceLocation, innermost_user_frame, parse_stack_trace

if TYPE_CHECKING:
    from kiln.capture._internal.capture import Capture

log = logging.getLogger(__name__)

CONTEXT_LINES = 2
_ASSIGNED = re.compile(r"^\s+(?P<name>[A-Za-z_]\w*)\s*(?::[^=]*)?=")

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.8em}
pre,code,td.code{font:12.5px/1.35 ui-monospace,Menlo,Consolas,monospace}
pre{margin:0;white-space:pre-wrap}
.card{border:1px solid #ddd;border-left:6px solid #888;border-radius:4px;padding:.5em 1em;margin:.8em 0}
.card.break{border-left-color:#c62828;background:#fff5f5}
.card.recompile{border-left-color:#e69500;background:#fffaf0}
.hint{color:#1b5e20}.muted{color:#666}
table{border-collapse:collapse}td{vertical-align:top;padding:0 .6em}
table.code td.src{color:#555;font-size:12px;white-space:nowrap}
table.code tr:hover{background:#f3f6ff}
table.listing td.ln{color:#999;text-align:right;user-select:none}
tr.break{background:#ffdada}tr.recompile{background:#ffedc7}tr.used{background:#eef4ff}
tr.gap td{color:#aaa}
"""


def write_html(result: Capture, path: Path) -> Path:
    """Render ``result`` and write it to ``path`` (parents created); return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(result), encoding="utf-8")
    log.info("wrote %s", path)
    return path


def render_html(result: Capture) -> str:
    """The whole page as a string."""
    sources = _SourceIndex()
    body = [
        f"<h1>kiln.capture report: {_e(result.function)}</h1>",
        f"<p>mode={_e(result.mode)} &middot; {plural(len(result.graphs), 'graph')} &middot; "
        f"{plural(len(result.breaks), 'graph break')} &middot; "
        f"{plural(len(result.recompiles), 'recompile')}</p>",
    ]
    body += _breaks_section(result, sources)
    body += _recompiles_section(result, sources)
    body += _graphs_section(result, sources)
    body += sources.render()
    title = f"kiln.capture: {_e(result.function)}"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{title}</title><style>{_CSS}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


class _SourceIndex:
    """The user source lines the page refers to, rendered as excerpts with anchors."""

    def __init__(self) -> None:
        self.files: dict[str, int] = {}
        self.lines: dict[str, dict[int, str]] = defaultdict(dict)

    def link(self, location: SourceLocation | None, kind: str = "used") -> str:
        """An anchor link to ``location``'s line in the excerpts (registering it)."""
        if location is None:
            return "<span class='muted'>unknown location</span>"
        file_id = self.files.setdefault(location.filename, len(self.files))
        lines = self.lines[location.filename]
        if lines.get(location.lineno) in (None, "used"):
            lines[location.lineno] = kind
        label = f"{_e(location.short)} in {_e(location.display_function)}"
        return f"<a href='#src-{file_id}-{location.lineno}' title='{_e(location.filename)}'>{label}</a>"

    def render(self) -> list[str]:
        if not self.files:
            return []
        out = ["<h2 id='sources'>Source</h2>"]
        for filename, file_id in self.files.items():
            uri = Path(filename).as_uri() if Path(filename).is_absolute() else filename
            out.append(f"<h3><a href='{_e(uri)}'>{_e(filename)}</a></h3>")
            out.append("<table class='listing'>")
            out += self._excerpt(filename, file_id)
            out.append("</table>")
        return out

    def _excerpt(self, filename: str, file_id: int) -> list[str]:
        marked = self.lines[filename]
        shown = sorted(
            {
                n
                for line in marked
                for n in range(line - CONTEXT_LINES, line + CONTEXT_LINES + 1)
                if n > 0
            }
        )
        rows, previous = [], None
        for lineno in shown:
            text = linecache.getline(filename, lineno)
            if not text and lineno not in marked:
                continue
            if previous is not None and lineno != previous + 1:
                rows.append("<tr class='gap'><td class='ln'>&vellip;</td><td></td></tr>")
            kind = marked.get(lineno, "")
            rows.append(
                f"<tr id='src-{file_id}-{lineno}' class='{kind}'><td class='ln'>{lineno}</td>"
                f"<td><pre>{_e(text.rstrip()) or '&nbsp;'}</pre></td></tr>"
            )
            previous = lineno
        return rows


def _breaks_section(result: Capture, sources: _SourceIndex) -> list[str]:
    if not result.breaks:
        return []
    out = ["<h2 id='breaks'>Graph breaks</h2>"]
    for number, graph_break in enumerate(result.breaks, start=1):
        location = graph_break.location
        out.append(f"<div class='card break' id='break-{number}'>")
        out.append(f"<h3>graph break {number}: {_e(graph_break.reason)}</h3>")
        out.append(f"<p>at {sources.link(location, 'break')}</p>")
        if location is not None and location.code_line:
            out.append(f"<pre>{_e(location.code_line)}</pre>")
        if graph_break.explanation:
            out.append(f"<p>why: {_e(graph_break.explanation)}</p>")
        if graph_break.hint:
            out.append(f"<p class='hint'>hint: {_e(graph_break.hint)}</p>")
        out += _details("Dynamo's message", graph_break.detail)
        out.append("</div>")
    return out


def _recompiles_section(result: Capture, sources: _SourceIndex) -> list[str]:
    if not result.recompiles:
        return []
    out = ["<h2 id='recompiles'>Recompiles</h2>"]
    for number, recompile in enumerate(result.recompiles, start=1):
        outcome = (
            "gave up: recompile limit reached"
            if recompile.gave_up
            else f"compile {recompile.compile_id}"
        )
        owner = f" of compile {_e(recompile.failed_entry)}" if recompile.failed_entry else ""
        out.append(f"<div class='card recompile' id='recompile-{number}'>")
        out.append(f"<h3>recompile {number}: {_e(outcome)}</h3>")
        out.append(
            f"<p>function {sources.link(recompile.function)}{_produced(result, recompile)}</p>"
        )
        out.append(f"<p>guard{owner} failed: <code>{_e(recompile.guard)}</code></p>")
        if recompile.location is not None:
            out.append(
                f"<p>guarded value used at {sources.link(recompile.location, 'recompile')}</p>"
            )
        if recompile.hint:
            out.append(f"<p class='hint'>hint: {_e(recompile.hint)}</p>")
        out += _details("Dynamo's reason", recompile.detail)
        out.append("</div>")
    return out


def _produced(result: Capture, recompile: Recompile) -> str:
    links = [
        f"<a href='#graph-{g.index}'>graph {g.index}</a>" for g in graphs_of(result, recompile)
    ]
    return f"; produced {', '.join(links)}" if links else ""


def _graphs_section(result: Capture, sources: _SourceIndex) -> list[str]:
    out = ["<h2 id='graphs'>Graphs</h2>"]
    if not result.graphs:
        out.append("<p>No graph was captured: the function ran entirely in eager Python.</p>")
    for graph in result.graphs:
        out += _graph_card(graph, sources, result)
    return out


def _graph_card(graph: CapturedGraph, sources: _SourceIndex, result: Capture) -> list[str]:
    kind = " break" if graph.graph_break is not None else ""
    compiled = f" &middot; compile {_e(graph.compile_id)}" if graph.compile_id else ""
    out = [
        f"<div class='card{kind}' id='graph-{graph.index}'>",
        f"<h3>graph {graph.index}: {plural(graph.num_ops, 'op')} ({_e(graph.ir)} IR){compiled}</h3>",
        f"<p>starts at {sources.link(graph.source)}</p>",
        f"<p>inputs: <code>{_e(inputs_summary(graph))}</code></p>",
    ]
    if graph.graph_break is not None:
        number = _break_number(graph, result)
        anchor = (
            f"<a href='#break-{number}'>graph break {number}</a>" if number else "a graph break"
        )
        out.append(f"<p>ended by {anchor}: {_e(graph.graph_break.reason)}</p>")
    counts = ", ".join(f"{_e(name)} &times;{n}" for name, n in graph.op_counts().most_common())
    out.append(f"<p class='muted'>{counts or 'no ops'}</p>")
    out.append("<details open><summary>code</summary><table class='code'>")
    out += _code_rows(graph.gm, sources)
    out.append("</table></details></div>")
    return out


def _break_number(graph: CapturedGraph, result: Capture) -> int | None:
    """The number of the break that ended ``graph`` in the page's list of breaks."""
    for number, graph_break in enumerate(result.breaks, start=1):
        if graph_break == graph.graph_break:
            return number
    return None


def _code_rows(gm: torch.fx.GraphModule, sources: _SourceIndex) -> list[str]:
    nodes = {node.name: node for node in gm.graph.nodes}
    rows = []
    for line in gm.code.strip("\n").rstrip().splitlines():
        match = _ASSIGNED.match(line)
        node = nodes.get(match["name"]) if match else None
        location = _node_location(node) if node is not None else None
        link = ""
        if location is not None:
            link = f"{sources.link(location)} <code>{_e(location.code_line)}</code>"
        rows.append(
            f"<tr><td class='code'><pre>{_e(line)}</pre></td><td class='src'>{link}</td></tr>"
        )
    return rows


def _node_location(node: torch.fx.Node) -> SourceLocation | None:
    text = node.meta.get("stack_trace")
    if not isinstance(text, str) or not text:
        return None
    return innermost_user_frame(parse_stack_trace(text))


def _details(summary: str, text: str) -> list[str]:
    if not text or "\n" not in text.strip():
        return []
    return [f"<details><summary>{_e(summary)}</summary><pre>{_e(text)}</pre></details>"]


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)
