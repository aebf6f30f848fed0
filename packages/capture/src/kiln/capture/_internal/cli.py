"""``python -m kiln.capture SCRIPT.py [args] --out DIR``: capture everything a script compiles.

The script runs as ``__main__`` (``sys.argv`` is ``[SCRIPT.py, *args]``) with
``torch._dynamo.optimize``, which ``torch.compile`` and ``nn.Module.compile`` call, wrapped
so that every backend first hands its graph to a ``CaptureSession``. The script's own
backend still compiles each graph (``--eager`` runs the graphs unchanged instead, which is
faster). Written to DIR:

* ``graphs/graph_NNN.kcg``: each graph, saved as it is recorded (``kiln.capture.load``);
* ``graphs/graph_NNN.py``: each graph's code, for reading;
* ``report.txt`` and ``report.html``: ``Capture.report()`` and ``Capture.to_html()``.

Options go before SCRIPT.py; ``--out DIR`` may also come after the script's arguments (as
the last ones, or anywhere before a ``--`` that passes the rest to the script verbatim).
The exit status is the script's.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import runpy
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from kiln.capture._internal.dynamo_mode import CaptureSession
from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.graph_file import FILE_SUFFIX, save
from kiln.capture._internal.inputs import describe_inputs

log = logging.getLogger(__name__)

PROG = "python -m kiln.capture"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    options = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    writer = GraphWriter(out / "graphs")
    session = CaptureSession(on_graph=writer)
    with session, recording_compiles(session, eager=options.eager):
        status = run_script(Path(options.script), options.args)
    result = session.result(function=Path(options.script).name)
    report = result.report() + writer.failure_lines() + _status_lines(options, status)
    (out / "report.txt").write_text(report, encoding="utf-8")
    result.to_html(out / "report.html")
    print(
        f"kiln.capture: {result} -> {out / 'report.txt'}, {out / 'report.html'}, "
        f"{len(writer.saved)} graph files in {writer.directory}",
        file=sys.stderr,
    )
    return status


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Our options before SCRIPT.py, plus ``--out DIR`` among the script's arguments."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [--out DIR] [--eager] SCRIPT.py [args ...] [--out DIR]",
        description="Run a Python script and write every graph torch.compile captures in it, "
        "a text report and an HTML page.",
        epilog="--out DIR may also follow the script's arguments; arguments after -- go to "
        "the script verbatim.",
    )
    parser.add_argument("--out", metavar="DIR", help="output directory (created if missing)")
    parser.add_argument(
        "--eager",
        action="store_true",
        help="run captured graphs eagerly instead of compiling them with the script's backend",
    )
    parser.add_argument("script", help="the Python script to run")
    # argparse would eat a "--" meant for the script: split at the script ourselves.
    script_at = _script_position(argv)
    options = parser.parse_args(argv[: script_at + 1])
    options.args, trailing_out = _split_out(list(argv[script_at + 1 :]))
    options.out = trailing_out or options.out
    if not options.out:
        parser.error("--out DIR is required")
    if not Path(options.script).is_file():
        parser.error(f"no such script: {options.script}")
    return options


def _script_position(argv: Sequence[str]) -> int:
    """Index of the first argument that is neither an option of ours nor --out's value."""
    position = 0
    while position < len(argv):
        arg = argv[position]
        if arg == "--out":
            position += 2
        elif arg.startswith("-"):
            position += 1
        else:
            return position
    return len(argv)  # no script: argparse reports it


def _split_out(args: list[str]) -> tuple[list[str], str | None]:
    """Remove ``--out DIR`` / ``--out=DIR`` from the script's arguments (not after ``--``)."""
    kept: list[str] = []
    out = None
    position = 0
    while position < len(args):
        arg = args[position]
        if arg == "--":
            kept += args[position + 1 :]
            break
        if arg == "--out" and position + 1 < len(args):
            out, position = args[position + 1], position + 2
            continue
        if arg.startswith("--out="):
            out = arg.removeprefix("--out=")
        else:
            kept.append(arg)
        position += 1
    return kept, out


class GraphWriter:
    """Saves each graph as it is recorded: ``graph_NNN.kcg`` and its code ``graph_NNN.py``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.saved: list[Path] = []
        self.failures: list[str] = []

    def __call__(self, graph: CapturedGraph) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        stem = self.directory / f"graph_{graph.index:03d}"
        try:
            stem.with_suffix(".py").write_text(_readable_code(graph), encoding="utf-8")
            self.saved.append(save(graph, stem.with_suffix(FILE_SUFFIX)))
        except Exception as error:  # runs inside Dynamo: never break the user's script
            log.warning("graph %d was not saved: %s", graph.index, error, exc_info=True)
            self.failures.append(f"graph {graph.index}: {type(error).__name__}: {error}")

    def failure_lines(self) -> str:
        if not self.failures:
            return ""
        return "\ngraphs not saved:\n" + "".join(f"  {line}\n" for line in self.failures)


def _readable_code(graph: CapturedGraph) -> str:
    header = [f"# graph {graph.index} ({graph.ir} IR), compile {graph.compile_id}"]
    if graph.source is not None:
        header.append(f"# starts at {graph.source}")
    header += [
        f"#   input {spec}"
        for spec in describe_inputs(graph.gm, graph.example_inputs, graph.input_sources)
    ]
    return "\n".join(header) + "\n" + graph.gm.print_readable(print_output=False) + "\n"


@contextlib.contextmanager
def recording_compiles(session: CaptureSession, *, eager: bool) -> Iterator[None]:
    """Make every ``torch.compile`` / ``torch._dynamo.optimize`` record into ``session``."""
    original = torch._dynamo.optimize

    def optimize(*args, **kwargs):  # torch.compile calls optimize(backend=..., ...)
        backend = args[0] if args else kwargs.pop("backend", "inductor")
        args = args[1:]
        kwargs["backend"] = session.wrap_backend(None if eager else backend)
        return original(*args, **kwargs)

    torch._dynamo.optimize = optimize
    try:
        yield
    finally:
        torch._dynamo.optimize = original


def run_script(script: Path, args: Sequence[str]) -> int:
    """Run ``script`` as ``__main__``; its exit status (1 if it raised)."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    script = script.resolve()  # absolute file names in the graphs' source locations
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
        return 0
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _status_lines(options: argparse.Namespace, status: int) -> str:
    command = " ".join([options.script, *options.args])
    outcome = "exited normally" if status == 0 else f"exited with status {status}"
    return f"\nscript: {command} ({outcome})\n"
