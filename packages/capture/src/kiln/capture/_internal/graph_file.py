"""``save`` / ``load``: one captured graph in one file, replayable offline.

The file is a ``torch.save`` archive holding three entries, and nothing else:

* ``kiln_capture``: the header (format name and version, torch, kiln-capture and Python
  versions), checked before anything else is read;
* ``body``: JSON text with the graph structure node by node (``graph_codec.py``), the
  symbol table of symbolic sizes (``fake_values.py``), the example inputs, and the
  ``CapturedGraph`` record (source line, graph break, compile id, input sources);
* ``tensors``: parameters, buffers, constants and example inputs, by key, with storage
  sharing preserved (tied weights stay tied).

``load`` reads it with ``torch.load(weights_only=True)`` and resolves operators by name
(``refs.py``): loading a file runs no code from it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import platform
import zipfile
from collections import Counter
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from kiln.capture._internal.breaks import GraphBreak
from kiln.capture._internal.fake_values import FakeValueBuilder
from kiln.capture._internal.graph import CapturedGraph
from kiln.capture._internal.graph_codec import (
    GraphFileError,
    decode_graph_module,
    encode_graph_module,
)
from kiln.capture._internal.refs import RefResolver
from kiln.capture._internal.source import SourceLocation
from kiln.capture._internal.values import UnsavableValue, ValueDecoder, ValueEncoder

log = logging.getLogger(__name__)

FORMAT = "kiln-capture-graph"
FORMAT_VERSION = 1
#: Format versions this code reads.
READABLE_FORMAT_VERSIONS = (1,)
FILE_SUFFIX = ".kcg"


def save(
    graph: CapturedGraph | torch.fx.GraphModule,
    path: str | os.PathLike[str],
    *,
    example_inputs: Sequence[Any] | None = None,
) -> Path:
    """Write ``graph`` (a ``CapturedGraph``, or a ``GraphModule`` plus ``example_inputs``) to
    ``path`` and return the path. Raises ``GraphFileError`` naming the node, attribute or
    input that a file cannot hold; nothing is written then."""
    record = _as_record(graph, example_inputs)
    encoder = ValueEncoder()
    dropped: Counter[str] = Counter()
    graph_data = encode_graph_module(record.gm, encoder, dropped)
    inputs = [
        _encode_input(encoder, position, v) for position, v in enumerate(record.example_inputs)
    ]
    body = {
        "graph": graph_data,
        "example_inputs": inputs,
        "record": _record_fields(record),
        "symbols": encoder.symbols.entries,
        "dropped_meta": dict(dropped),
    }
    payload = {"kiln_capture": file_header(), "body": json.dumps(body), "tensors": encoder.tensors}
    target = Path(path)
    torch.save(payload, target)
    if dropped:
        log.info("saved %s; node.meta keys not saved: %s", target, dict(dropped))
    return target


def load(
    path: str | os.PathLike[str],
    *,
    trusted_modules: Iterable[str] = (),
    map_location: Any = None,
) -> CapturedGraph:
    """Read a file written by ``save``: a ``CapturedGraph`` whose ``gm`` runs on its
    ``example_inputs`` (real tensors when they were saved; symbolic ints come back as their
    example value) and whose nodes carry fake values with the same symbolic sizes.

    Only operators and callables under ``torch``, ``operator``, ``math`` and ``builtins``
    are resolved, plus the module prefixes in ``trusted_modules``. ``map_location`` is
    passed to ``torch.load``. Raises ``GraphFileError`` for a file that is not a graph file,
    comes from an incompatible format or torch version, or names an unknown operator.
    """
    payload = _read_payload(Path(path), map_location)
    header = payload.get("kiln_capture") if isinstance(payload, dict) else None
    check_compatible(header, path)
    try:
        return _decode_payload(payload, RefResolver(trusted_modules))
    except (KeyError, TypeError, ValueError) as error:  # GraphFileError is a ValueError
        raise GraphFileError(
            f"{path} (saved with torch {header.get('torch_version')}, loading with torch "
            f"{torch.__version__}): {error}"
        ) from error


def _decode_payload(payload: dict[str, Any], resolver: RefResolver) -> CapturedGraph:
    body = json.loads(payload["body"])
    fakes = FakeValueBuilder(body["symbols"])
    decoder = ValueDecoder(payload["tensors"], fakes, resolver)
    gm = decode_graph_module(body["graph"], decoder)
    example_inputs = tuple(
        _concrete(decoder.decode(v, {}, strict=True)) for v in body["example_inputs"]
    )
    return CapturedGraph(gm, example_inputs, **_decode_record_fields(body["record"]))


def file_header() -> dict[str, Any]:
    """The header ``save`` writes: format and the versions of what wrote it."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "torch_version": str(torch.__version__),
        "kiln_capture_version": _package_version(),
        "python_version": platform.python_version(),
    }


def check_compatible(header: Any, path: str | os.PathLike[str]) -> None:
    """Raise ``GraphFileError`` unless ``header`` is a graph-file header this code reads."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise GraphFileError(
            f"{path} is not a kiln.capture graph file (kiln.capture.save writes them)"
        )
    version = header.get("format_version")
    if version not in READABLE_FORMAT_VERSIONS:
        newer = isinstance(version, int) and version > max(READABLE_FORMAT_VERSIONS)
        advice = "upgrade kiln-capture" if newer else "capture and save the graph again"
        raise GraphFileError(
            f"{path} is in graph-file format {version!r} (written by kiln-capture "
            f"{header.get('kiln_capture_version')}); this kiln-capture {_package_version()} "
            f"reads format {', '.join(map(str, READABLE_FORMAT_VERSIONS))}: {advice}"
        )
    saved = str(header.get("torch_version"))
    if _major(saved) != _major(torch.__version__):
        raise GraphFileError(
            f"{path} was saved with torch {saved} and this is torch {torch.__version__}: a "
            f"graph's operators belong to one torch major version; load it with torch "
            f"{_major(saved)}.x, or capture it again"
        )
    if _minor(saved) != _minor(torch.__version__):
        log.warning(
            "%s was saved with torch %s, loading with torch %s: operator schemas are checked "
            "one by one",
            path,
            saved,
            torch.__version__,
        )


def _read_payload(path: Path, map_location: Any) -> Any:
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile) as error:
        raise GraphFileError(
            f"{path} is not a kiln.capture graph file, or it is damaged: {error}"
        ) from error


def _as_record(
    graph: CapturedGraph | torch.fx.GraphModule, example_inputs: Sequence[Any] | None
) -> CapturedGraph:
    if isinstance(graph, CapturedGraph):
        if example_inputs is not None:
            return dataclasses.replace(graph, example_inputs=tuple(example_inputs))
        return graph
    if not isinstance(graph, torch.fx.GraphModule):
        raise TypeError(f"save takes a CapturedGraph or a GraphModule, not {type(graph).__name__}")
    aten = any(isinstance(n.target, torch._ops.OpOverload) for n in graph.graph.nodes)
    return CapturedGraph(graph, tuple(example_inputs or ()), ir="aten" if aten else "torch")


def _encode_input(encoder: ValueEncoder, position: int, value: Any) -> Any:
    try:
        return encoder.encode(value)
    except UnsavableValue as error:
        raise GraphFileError(f"cannot save example input {position}: {error}") from error


def _concrete(value: Any) -> Any:
    """Symbolic example inputs (Dynamo passes SymInts for symbolic sizes) as their hint."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        hint = value.node.hint
        return hint if hint is not None else value
    return value


def _record_fields(record: CapturedGraph) -> dict[str, Any]:
    graph_break = record.graph_break
    return {
        "index": record.index,
        "ir": record.ir,
        "compile_id": record.compile_id,
        "input_sources": list(record.input_sources),
        "source": dataclasses.asdict(record.source) if record.source else None,
        "graph_break": None
        if graph_break is None
        else {
            "reason": graph_break.reason,
            "location": dataclasses.asdict(graph_break.location) if graph_break.location else None,
            "hint": graph_break.hint,
            "detail": graph_break.detail,
            "user_stack": [dataclasses.asdict(frame) for frame in graph_break.user_stack],
        },
    }


def _decode_record_fields(fields: dict[str, Any]) -> dict[str, Any]:
    def location(data: dict | None) -> SourceLocation | None:
        return SourceLocation(**data) if data else None

    graph_break = fields["graph_break"]
    if graph_break is not None:
        graph_break = GraphBreak(
            reason=graph_break["reason"],
            location=location(graph_break["location"]),
            hint=graph_break["hint"],
            detail=graph_break["detail"],
            user_stack=tuple(SourceLocation(**frame) for frame in graph_break["user_stack"]),
        )
    return {
        "index": fields["index"],
        "ir": fields["ir"],
        "compile_id": fields["compile_id"],
        "input_sources": tuple(fields["input_sources"]),
        "source": location(fields["source"]),
        "graph_break": graph_break,
    }


def _package_version() -> str:
    try:
        return metadata.version("kiln-capture")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _major(version: str) -> str:
    return version.split(".")[0]


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])
