"""The key of the whole-graph cache: everything a compiled graph's code depends on.

Five parts, each hashed on its own so a miss can say which one changed (logged at debug level):
  graph    the Dynamo graph: each node's op, name, target and arguments, and the metadata and
           content of the tensors it reads as attributes;
  inputs   each example input's dtype, sizes and strides (symbols by name), storage offset,
           device, layout, requires_grad, and which inputs share storage;
  state    grad mode, deterministic mode, the default dtype and device, autocast, the enabled SDPA
           backends, the global state Dynamo guards on (as it serializes it), and the shape
           environment's guards;
  options  the backend's options that change what is generated, the codegen and its options;
  versions torch, Triton (when installed), Python, a hash of kiln's own source files (so editing
           kiln invalidates its cache), the machine and CPU, and the codegen's compiler when it
           names one.
A graph whose key cannot be stable across processes (a target with no importable name, an
argument printed with an address, a module call) is not cacheable: `graph_key` says why.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import pathlib
import platform
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.multiprocessing.reductions import StorageWeakRef

import kiln

from . import attention_masks, codegens, conv_batch_norm, padded_linears
from .options import KilnOptions

# Options that do not change the generated code (where caches and dumps go, the cache's own knobs).
_NOT_IN_KEY = frozenset({"debug_dir", "cache_dir", "graph_cache", "graph_cache_max_bytes"})
_PART_NAMES = ("graph", "inputs", "state", "options", "versions")


class Uncacheable(Exception):
    """Why a graph cannot be cached (a debug-level message, not an error)."""


@dataclasses.dataclass(frozen=True, slots=True)
class GraphKey:
    """The key's digest (an entry's file name) and each part's text (for debug logs)."""

    digest: str
    parts: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        """Each part's short hash: two keys that differ show which part did."""
        return ", ".join(f"{name} {_digest(text)[:10]}" for name, text in self.parts)


def graph_key(gm: fx.GraphModule, example_inputs: Sequence[Any], options: KilnOptions,
              codegen: codegens.Selected) -> GraphKey:
    """The key of compiling `gm` for `example_inputs`; raises `Uncacheable` naming why not."""
    texts = (_graph_text(gm), _inputs_text(example_inputs), _state_text(example_inputs),
             _options_text(options, codegen), _versions_text(codegen.options))
    parts = tuple(zip(_PART_NAMES, texts))
    digest = _digest("\0".join(f"{name}={text}" for name, text in parts))[:32]
    return GraphKey(digest, parts)


def _digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def target_name(target: Any) -> str:
    """A name of a node's target that is the same in every process, or `Uncacheable`."""
    if isinstance(target, str):
        return target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if module is None and hasattr(target, "__objclass__"):  # a method of a C type (Tensor.add)
        module, qualname = target.__objclass__.__module__, f"{target.__objclass__.__qualname__}.{target.__name__}"
    if module is None or qualname is None or "<" in qualname:
        raise Uncacheable(f"target {target!r} has no importable name")
    return f"{module}.{qualname}"


def _stable_repr(value: Any) -> str:
    text = repr(fx.node.map_arg(value, lambda n: f"%{n.name}"))
    if " at 0x" in text or " object at " in text:
        raise Uncacheable(f"argument {text[:200]} has no stable printed form")
    return text


def _tensor_text(tensor: torch.Tensor, content: bool) -> str:
    layout = (f"{tensor.dtype} {_sizes(tensor.shape)} {_sizes(tensor.stride())} {tensor.storage_offset()} "
              f"{tensor.device} {tensor.layout} grad={tensor.requires_grad}")
    if type(tensor) not in (torch.Tensor, torch.nn.Parameter, torch._subclasses.FakeTensor):
        raise Uncacheable(f"a tensor of subclass {type(tensor).__name__}")
    if content:
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        layout += " " + _digest(data.numpy().tobytes())
    return layout


def _sizes(values: Sequence[Any]) -> str:
    return "(" + ",".join(str(v) for v in values) + ")"


def _graph_text(gm: fx.GraphModule) -> str:
    lines = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            raise Uncacheable(f"node {node.name} calls module {node.target}")
        line = f"{node.op} {node.name} {target_name(node.target)} {_stable_repr(node.args)} {_stable_repr(node.kwargs)}"
        if node.op == "get_attr":
            value = gm
            for attribute in node.target.split("."):
                value = getattr(value, attribute)
            if not isinstance(value, torch.Tensor):
                raise Uncacheable(f"attribute {node.target} is a {type(value).__name__}, not a tensor")
            line += " = " + _tensor_text(value, content=True)
        lines.append(line)
    if type(gm.graph._codegen) is not fx.graph.CodeGen:
        raise Uncacheable(f"the graph has a custom code generator ({type(gm.graph._codegen).__name__})")
    return "\n".join(lines)


def _inputs_text(example_inputs: Sequence[Any]) -> str:
    lines, storages = [], []
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            storage = StorageWeakRef(value.untyped_storage())
            shared = next((i for i, s in enumerate(storages) if s == storage), len(storages))
            storages.append(storage)
            lines.append(f"{_tensor_text(value, content=False)} storage={shared}")
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
            lines.append(f"{type(value).__name__} {value}")
        else:
            raise Uncacheable(f"an input of type {type(value).__name__}")
    return "\n".join(lines)


def shape_guards(example_inputs: Sequence[Any]) -> list[Any]:
    """The guards on sizes Dynamo installs for this graph so far (compiling may add some: a
    graph whose compile did cannot be cached, as a cache hit would not add them)."""
    shape_env = getattr(detect_fake_mode(example_inputs), "shape_env", None)
    return list(shape_env.guards) if shape_env is not None else []


def _state_text(example_inputs: Sequence[Any]) -> str:
    """Global state tracing reads: a graph traced under another state is another program.
    The default device (where factory calls without a device allocate), autocast (set outside
    the compiled code: Dynamo recompiles when it changes, and the same graph text traced under
    it computes in bfloat16) and the SDPA backends (which attention op a CUDA graph traces to)
    are read while AOTAutograd traces; the graph does not show them. Dynamo's serialized state
    repeats grad mode, autocast and the default dtype: they stay named here for a torch whose
    guard has no serialized form (untested on torch 2.11 so far)."""
    guards = sorted(str(g.expr) for g in shape_guards(example_inputs))
    return (f"grad={torch.is_grad_enabled()} deterministic={torch.are_deterministic_algorithms_enabled()} "
            f"fill={torch.utils.deterministic.fill_uninitialized_memory} default={torch.get_default_dtype()} "
            f"device={torch.get_default_device()} {_autocast_text()} {_sdpa_text()} {_dynamo_state_text()} "
            f"guards={guards}")


def _dynamo_state_text() -> str:
    """The global state Dynamo guards every frame on (grad mode, autocast, default dtype, torch
    function modes, matmul precision flags, thread count), as Dynamo serializes it: a graph
    Dynamo recompiles for a change of global state then never meets an entry stored under the
    old one, whatever state a later torch adds. Parts that change nothing kiln generates (the
    thread count) cost a miss, never a wrong hit."""
    guard = getattr(torch._C._dynamo.guards, "GlobalStateGuard", None)
    try:
        return f"dynamo_state={guard().__getstate__()}"
    except (AttributeError, TypeError, RuntimeError):  # a torch without the serialized form
        return "dynamo_state=unavailable"


def _autocast_text() -> str:
    devices = ("cpu", "cuda")
    state = [f"{d}:{torch.get_autocast_dtype(d)}" if torch.is_autocast_enabled(d) else f"{d}:off" for d in devices]
    return f"autocast={','.join(state)} cache={torch.is_autocast_cache_enabled()}"


def _sdpa_text() -> str:
    flags = torch.backends.cuda
    return (f"sdpa=flash:{flags.flash_sdp_enabled()},efficient:{flags.mem_efficient_sdp_enabled()},"
            f"math:{flags.math_sdp_enabled()},cudnn:{flags.cudnn_sdp_enabled()}")


def _options_text(options: KilnOptions, codegen: codegens.Selected) -> str:
    if options.lowerings is not None:
        raise Uncacheable("a custom lowering table (options.lowerings)")
    # graph passes switched by the environment or torch's flags change what is generated too
    passes = (f"fold_conv_batch_norm={conv_batch_norm.ENABLED and conv_batch_norm._fused_conv() is not None} "
              f"dense_attention_masks={attention_masks.ENABLED} tf32={torch.backends.cuda.matmul.allow_tf32} "
              f"pad_linears={padded_linears.ENABLED}")
    return f"{_fields_text(options)} codegen={codegen.codegen.name} {_fields_text(codegen.options)} {passes}"


def _fields_text(options: Any) -> str:
    """A dataclass of options without the fields naming where things are stored; else its repr."""
    if not dataclasses.is_dataclass(options):
        return repr(options)
    return repr({f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name not in _NOT_IN_KEY})


def _versions_text(codegen_options: Any) -> str:
    compiler = getattr(codegen_options, "compiler", None)
    return (f"torch {torch.__version__} triton {_triton_version()} python {sys.version} kiln {kiln_source_hash()} "
            f"{_machine()} compiler {_compiler_version(compiler) if isinstance(compiler, str) else None}")


@functools.lru_cache(maxsize=1)
def kiln_source_hash() -> str:
    """A hash of every Python file of the kiln packages, each from the directory it is (or would
    be) imported from: another checkout further on the namespace path does not count, and a
    package this process has not imported yet counts the same (a cache hit imports fewer)."""
    digest = hashlib.sha256()
    names = sorted({path.parent.name for entry in kiln.__path__ for path in pathlib.Path(entry).glob("*/__init__.py")})
    for name in names:
        spec = importlib.util.find_spec(f"kiln.{name}")
        if spec is None or not spec.submodule_search_locations:
            continue
        root = pathlib.Path(spec.submodule_search_locations[0])
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def _triton_version() -> str | None:
    """Triton's version, read from its metadata (importing triton takes a second)."""
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    """The CPU kernels were built for (-march=native): a cache shared by machines must tell them apart."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = {"model name", "flags", "Features", "CPU part"}
    first = {}
    for line in text.splitlines():
        name = line.split(":")[0].strip()
        if name in wanted:
            first.setdefault(name, line)
    return platform.machine() + " " + _digest("\n".join(first.values()))[:16]


@functools.lru_cache(maxsize=4)
def _compiler_version(compiler: str) -> str:
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return f"{compiler} (unavailable)"
    return (done.stdout.splitlines() or [compiler])[0]
