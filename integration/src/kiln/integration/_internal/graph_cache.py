"""The whole-graph compiled-artifact cache: a later process loads a compiled graph instead of
tracing, decomposing, lowering and generating code again.

An entry, ``<root>/graphs/<key>.pkl``, holds what rebuilds the runnable module: the compiled
graph's nodes (op, name, target, arguments; ATen ops by qualified name, compiled kernels as
objects that pickle themselves: codegen_cpp's re-open their checked shared library,
codegen_triton's hold their generated source and rebuild from it), the tensors it reads as
attributes (those that are attributes of the Dynamo graph by reference, taken from the new one),
and the graph's `GraphReport`. A training graph's entry holds its compiled forward and backward,
the backward ATen graph and autograd_trace's `RuntimePlan` instead (`TrainingParts`; written
once the backward has compiled). Paths under the cache's root (kernel libraries) are stored
relative to it, so a copied cache works (`cache_archive`). Entries are written atomically with a
size and sha256 sidecar (loopir's `ArtifactCache`, in the per-user private directory), checked
before they are read; a damaged entry, or one whose kernel library is gone or damaged, is a miss
and is rebuilt. Hits touch the entry; after each store the least recently used entries go until
the directory holds at most `graph_cache_max_bytes`. The key is `graph_key.graph_key`.
"""

from __future__ import annotations

import copyreg
import dataclasses
import io
import logging
import os
import pathlib
import pickle
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from kiln import autograd_trace
from kiln.loopir.codegen import ArtifactCache, ArtifactCacheError, default_cache_root

from . import codegens
from .graph_key import GraphKey, Uncacheable, graph_key
from .options import KilnOptions
from .report import GraphReport

log = logging.getLogger(__name__)
FORMAT = 2  # bump when an entry's layout changes: older entries then miss
SUFFIX = ".pkl"


def cache_root(options: KilnOptions) -> pathlib.Path:
    """The directory of whole-graph entries: ``<cache_dir or the per-user default>/graphs``."""
    return (options.cache_dir if options.cache_dir is not None else default_cache_root()) / "graphs"


@dataclasses.dataclass(frozen=True, slots=True)
class _NodeRef:
    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class _DynamoAttribute:
    """An attribute of the compiled graph that is one of the Dynamo graph's (a parameter, say):
    taken from the Dynamo graph being compiled, not stored."""

    target: str


def _op_by_name(qualified: str, overload: str | None) -> Any:
    namespace, name = qualified.split("::")
    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)


def _leaf_spec() -> pytree.TreeSpec:
    """pytree's leaf spec, made without the FutureWarning that unpickling a `LeafSpec` (deprecated
    in torch 2.13, which has `treespec_leaf`) prints in every process loading a training entry."""
    make = getattr(pytree, "treespec_leaf", None)
    return make() if make is not None else pytree.LeafSpec()


class _Pickler(pickle.Pickler):
    """Pickles ATen operators by name (they do not pickle themselves), pytree leaf specs as
    `_leaf_spec()`, and paths inside the cache's root (kernel libraries) relative to it, so a
    cache copied elsewhere (`save_cache`, `load_cache`) still finds its artifacts."""

    def __init__(self, file: io.BytesIO, root: pathlib.Path) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.root_prefix = str(root) + os.sep

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch._ops.OpOverload):
            return _op_by_name, (obj._schema.name, obj._overloadname)
        if isinstance(obj, torch._ops.OpOverloadPacket):
            return _op_by_name, (obj._qualified_op_name, None)
        if isinstance(obj, pytree.TreeSpec) and obj.is_leaf():
            return _leaf_spec, ()
        return NotImplemented

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is str and obj.startswith(self.root_prefix):
            return (_UNDER_ROOT, obj[len(self.root_prefix):])
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, root: pathlib.Path) -> None:
        super().__init__(file)
        self.root = root

    def persistent_load(self, pid: Any) -> Any:
        kind, relative = pid
        if kind != _UNDER_ROOT:
            raise pickle.UnpicklingError(f"unknown persistent reference {kind!r}")
        return str(self.root / relative)


_UNDER_ROOT = "under-cache-root"


def _dumps(value: Any, root: pathlib.Path) -> bytes:
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, root)
    pickler.dispatch_table = copyreg.dispatch_table.copy()
    pickler.dump(value)
    return buffer.getvalue()


def _loads(raw: bytes, root: pathlib.Path) -> Any:
    return _Unpickler(io.BytesIO(raw), root).load()


def freeze_module(module: fx.GraphModule, dynamo_gm: fx.GraphModule) -> dict[str, Any]:
    """A compiled graph module as plain data (see the module docstring); raises when it has
    something that cannot be stored (a module call, a custom code generator)."""
    if type(module.graph._codegen) is not fx.graph.CodeGen:
        raise TypeError(f"the compiled graph has a custom code generator ({type(module.graph._codegen).__name__})")
    dynamo_tensors = {_identity(t): name for name, t in _tensor_attributes(dynamo_gm)}
    nodes, attributes = [], {}
    for node in module.graph.nodes:
        if node.op == "call_module":
            raise TypeError(f"the compiled graph calls module {node.target}")
        if node.op == "get_attr":
            value = _attribute(module, node.target)
            if isinstance(value, torch.Tensor) and _identity(value) in dynamo_tensors:
                value = _DynamoAttribute(dynamo_tensors[_identity(value)])
            attributes[node.target] = value
        to_ref = lambda n: _NodeRef(n.name)  # noqa: E731
        nodes.append((node.op, node.name, node.target, fx.node.map_arg(node.args, to_ref),
                      fx.node.map_arg(node.kwargs, to_ref)))
    # a training forward's mutations it writes itself (autograd_trace's runtime skips their copies)
    written = getattr(module, autograd_trace.WRITTEN_ATTRIBUTE, ())
    return {"nodes": nodes, "attributes": attributes, "inputs_written": tuple(written)}


def thaw_module(frozen: dict[str, Any], dynamo_gm: fx.GraphModule) -> fx.GraphModule:
    """The runnable module `freeze_module` described, its Dynamo attributes from `dynamo_gm`."""
    graph = fx.Graph()
    made: dict[str, fx.Node] = {}

    def to_node(value: Any) -> Any:
        if isinstance(value, _NodeRef):
            return made[value.name]
        if isinstance(value, (list, tuple)):
            return type(value)(to_node(v) for v in value)
        if isinstance(value, dict):
            return {k: to_node(v) for k, v in value.items()}
        return value

    for op, name, target, args, kwargs in frozen["nodes"]:
        made[name] = graph.create_node(op, target, to_node(args), to_node(kwargs), name=name)
    root = {target: _attribute(dynamo_gm, value.target) if isinstance(value, _DynamoAttribute) else value
            for target, value in frozen["attributes"].items()}
    module = fx.GraphModule(root, graph)
    if frozen.get("inputs_written"):
        setattr(module, autograd_trace.WRITTEN_ATTRIBUTE, frozen["inputs_written"])
    return module


def _attribute(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _tensor_attributes(gm: fx.GraphModule) -> list[tuple[str, torch.Tensor]]:
    found = dict(gm.named_parameters(remove_duplicate=False)) | dict(gm.named_buffers(remove_duplicate=False))
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _attribute(gm, node.target)
            if isinstance(value, torch.Tensor):
                found[node.target] = value
    return list(found.items())


def _identity(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.device)


@dataclasses.dataclass(frozen=True)
class TrainingParts:
    """What a training graph's entry is made of, once its backward has compiled: the runtime's
    plan, the compiled forward and backward modules, the backward ATen graph (which tangents
    reach which gradient; compiled autograd inlines it) and the backward's report."""

    plan: autograd_trace.RuntimePlan
    forward: fx.GraphModule
    backward: fx.GraphModule
    backward_graph: fx.GraphModule
    backward_report: GraphReport


def _freeze_training(parts: TrainingParts, dynamo_gm: fx.GraphModule) -> dict[str, Any]:
    return {"plan": parts.plan, "forward": freeze_module(parts.forward, dynamo_gm),
            "backward": freeze_module(parts.backward, dynamo_gm),
            "backward_graph": freeze_module(parts.backward_graph, dynamo_gm),
            "backward_report": parts.backward_report}


def _thaw_training(frozen: dict[str, Any], dynamo_gm: fx.GraphModule,
                   on_backward: Callable[[GraphReport], None] | None) -> torch.nn.Module:
    backward = thaw_module(frozen["backward"], dynamo_gm)  # now: a damaged library is a miss, not a failed step

    def compile_backward() -> fx.GraphModule:
        if on_backward is not None:
            on_backward(frozen["backward_report"])
        return backward

    # autograd_trace imports its runtime on this first use (see its __init__): an inference hit never does
    return autograd_trace.AotCompiled.from_plan(dynamo_gm, frozen["plan"], thaw_module(frozen["forward"], dynamo_gm),
                                                compile_backward, thaw_module(frozen["backward_graph"], dynamo_gm))


class GraphCache:
    """Whole-graph entries under `directory` (see the module docstring)."""

    def __init__(self, directory: pathlib.Path, max_bytes: int) -> None:
        self.directory = pathlib.Path(directory)
        self.max_bytes = max_bytes
        self.files = ArtifactCache(self.directory)

    def path(self, key: GraphKey) -> pathlib.Path:
        return self.directory / f"{key.digest}{SUFFIX}"

    def load(self, key: GraphKey, dynamo_gm: fx.GraphModule,
             on_backward: Callable[[GraphReport], None] | None = None) -> tuple[torch.nn.Module, GraphReport] | None:
        """The cached module and report, or None on a miss (a damaged entry is a miss, logged).
        A training entry's module runs the stored forward and backward under autograd;
        `on_backward` gets the stored backward's report on the first backward call."""
        path = self.path(key)
        if not path.exists():
            log.debug("kiln graph cache miss %s (%s)", key.digest, key.describe())
            return None
        try:
            self.files.ensure_directory()
            if not self.files.verified(path):  # it warns: the entry is rebuilt
                return None
            entry = _loads(path.read_bytes(), self.directory.parent)
            if entry.get("format") != FORMAT:
                log.debug("kiln graph cache: entry %s has format %s, not %s: rebuilding", path, entry.get("format"),
                          FORMAT)
                return None
            if "training" in entry:
                module = _thaw_training(entry["training"], dynamo_gm, on_backward)
            else:
                module = thaw_module(entry["module"], dynamo_gm)
        except Exception as exc:  # a library gone or damaged, an unreadable entry: compile again
            log.warning("kiln graph cache: entry %s cannot be loaded (%s: %s): rebuilding it", path,
                        type(exc).__name__, exc)
            return None
        os.utime(path)  # least recently used goes first
        log.debug("kiln graph cache hit %s (%s)", key.digest, key.describe())
        return module, entry["report"]

    def store(self, key: GraphKey, compiled: fx.GraphModule | TrainingParts, report: GraphReport,
              dynamo_gm: fx.GraphModule, added_guards: int = 0) -> None:
        """Write the entry of an inference graph's compiled module or a training graph's parts
        (atomically, with its checksum); a module that cannot be stored (or whose compile added
        `added_guards` size guards) is logged at debug level and left out."""
        if added_guards:
            log.debug("kiln graph cache: graph %d not stored: compiling it added %d size guards", report.index,
                      added_guards)
            return
        try:
            if isinstance(compiled, TrainingParts):
                body = {"training": _freeze_training(compiled, dynamo_gm)}
            else:
                body = {"module": freeze_module(compiled, dynamo_gm)}
            raw = _dumps({"format": FORMAT, **body, "report": report}, self.directory.parent)
        except Exception as exc:  # e.g. a codegen whose kernels do not pickle
            log.debug("kiln graph cache: graph %d not stored: %s: %s", report.index, type(exc).__name__, exc)
            return
        try:  # a full disk or a foreign directory must not fail the compile (or a training step's backward)
            self.files.write(self.path(key), raw)
            log.debug("kiln graph cache: stored %s (%d bytes; %s)", key.digest, len(raw), key.describe())
            self.evict()
        except (OSError, ArtifactCacheError) as exc:
            log.warning("kiln graph cache: graph %d not stored in %s: %s", report.index, self.directory, exc)

    def entries(self) -> list[tuple[pathlib.Path, int, float]]:
        """(path, bytes with its sidecar, last use) of each entry, least recently used first."""
        found = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                info = path.stat()
                sidecar = path.with_name(path.name + ".sha256")
                size = info.st_size + (sidecar.stat().st_size if sidecar.exists() else 0)
            except OSError:  # removed meanwhile by another process
                continue
            found.append((path, size, info.st_mtime))
        return sorted(found, key=lambda entry: entry[2])

    def evict(self) -> list[pathlib.Path]:
        """Remove least recently used entries until the cache holds at most `max_bytes`."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        removed = []
        for path, size, _ in entries:
            if total <= self.max_bytes:
                break
            _remove_entry(path)
            total -= size
            removed.append(path)
        if removed:
            log.debug("kiln graph cache: evicted %d least recently used entries", len(removed))
        return removed

    def clear(self) -> int:
        """Remove every entry; returns how many."""
        entries = self.entries()
        for path, _, _ in entries:
            _remove_entry(path)
        return len(entries)

    def info(self) -> str:
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        lines = [f"kiln whole-graph cache: {self.directory}",
                 f"  {len(entries)} entries, {total / 2**20:.1f} MiB of at most {self.max_bytes / 2**20:.0f} MiB"]
        if entries:
            newest = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entries[-1][2]))
            lines.append(f"  last used: {newest}")
        return "\n".join(lines)


def _remove_entry(path: pathlib.Path) -> None:
    for file in (path, path.with_name(path.name + ".sha256")):
        file.unlink(missing_ok=True)


def open_cache(gm: fx.GraphModule, example_inputs: Any, options: KilnOptions, codegen: codegens.Selected
               ) -> tuple[GraphCache, GraphKey] | None:
    """The cache and key for compiling `gm`, or None (saying why at debug level) when the
    graph is not cached: the cache is off, a debug mode is on, or a key that would not be the
    same in another process. (A graph whose compiled kernels do not pickle is left out when it
    is stored.)"""
    reason = None
    if not options.graph_cache:
        reason = "off (graph_cache=False / KILN_GRAPH_CACHE=0)"
    elif options.debug_dir is not None or options.verify or options.verify_calls:
        reason = "not used with debug_dir, verify or verify_calls (every stage must run)"
    if reason is None:
        try:
            key = graph_key(gm, example_inputs, options, codegen)
        except Uncacheable as exc:
            reason = f"not cacheable: {exc}"
    if reason is not None:
        log.debug("kiln graph cache: %s", reason)
        return None
    return GraphCache(cache_root(options), options.graph_cache_max_bytes), key
