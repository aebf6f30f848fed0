"""`mode="reduce-overhead"`: a compiled inference graph replayed as a CUDA graph.

A graph of many small kernels is bound by the host: Python launching kernels one by one takes
longer than the GPU takes to run them. Recorded once as a CUDA graph, each later call is one
replay: the inputs are copied into the graph's static buffers, the recorded kernels run with no
Python per kernel, and the outputs are copied out of the graph's memory (so a result stays valid
after the next call, unlike Inductor's cudagraph trees, which hand out the static buffers).

- One graph is recorded per set of input sizes, strides and dtypes, up to `MAX_RECORDINGS`;
  past that (shapes that keep changing) the module runs without CUDA graphs, and says so once.
- Inputs that keep their storage from call to call (parameters, buffers, a KV cache updated in
  place) are read where they are: the graph is recorded on those tensors, and a call where one
  of them moved is recorded anew. Other inputs are copied in.
- Each recording has its own memory pool (`torch.cuda.graph`'s default): a graph's
  intermediates stay allocated while the module lives.
- A graph that cannot be recorded (it waits for the CPU: `.item()`, a data-dependent size, a
  kernel with `sync_checks`; or an input lives on the CPU), a graph that writes into its inputs
  (the write would land in a static copy), and every training graph (autograd runs its
  backward outside any recording) run as they would without the mode, and say so once.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

log = logging.getLogger(__name__)

_VIEWS = frozenset({"getitem", "__getitem__", "view", "reshape", "transpose", "permute", "select", "narrow",
                    "expand", "unsqueeze", "squeeze", "flatten", "t", "contiguous", "view_as", "unflatten",
                    "as_strided", "split", "chunk", "unbind", "detach"})

MAX_RECORDINGS = 8  # distinct input layouts recorded per graph before giving up on CUDA graphs
WARMUP_CALLS = 1  # calls run plainly first, to see which inputs keep their storage


@dataclasses.dataclass
class _Recording:
    graph: torch.cuda.CUDAGraph
    inputs: list[Any]  # the tensors the graph reads: static copies, or the caller's own tensors
    copied: tuple[int, ...]  # positions of inputs copied in on each call
    pinned: tuple[tuple[int, int], ...]  # (position, data_ptr) of inputs read in place
    outputs: Any


def _layout_key(args: Sequence[Any]) -> tuple:
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a
                 for a in args)


def _name(target: Any) -> str:
    return getattr(target, "__name__", str(target)).split(".")[-1]


def writes_to_inputs(gm: fx.GraphModule) -> bool:
    """Whether a Dynamo graph writes in place into one of its inputs (or a view of one)."""
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method") or not node.args:
            continue
        name = _name(node.target)
        in_place = node.target is operator.setitem or (name.endswith("_") and not name.startswith("_")) \
            or "out" in node.kwargs
        base = node.args[0]
        while in_place and isinstance(base, fx.Node) and base.op != "placeholder" and base.args \
                and _name(base.target) in _VIEWS:
            base = base.args[0]
        if in_place and isinstance(base, fx.Node) and base.op == "placeholder":
            return True
    return False


def cannot_record_reason(example_inputs: Sequence[Any], writes_inputs: bool) -> str | None:
    """Why a graph with these example inputs is not recorded, or None."""
    if writes_inputs:
        return "it writes into its inputs"
    tensors = [a for a in example_inputs if isinstance(a, torch.Tensor)]
    if not torch.cuda.is_available():
        return "this machine has no CUDA device"
    if not tensors or any(t.device.type != "cuda" for t in tensors):
        return "not every input is a CUDA tensor"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "it is a training graph (autograd runs its backward outside the recording)"
    return None


class CudaGraphed(torch.nn.Module):
    """Runs `module` through recorded CUDA graphs; see the module docstring."""

    def __init__(self, module: torch.nn.Module, name: str) -> None:
        super().__init__()
        self.module = module
        self.name = name
        self._recordings: dict[tuple, _Recording] = {}
        self._seen: dict[tuple, list[int]] = {}  # layout -> data_ptrs of the warm-up call
        self._disabled: str | None = None

    def _disable(self, reason: str) -> None:
        self._disabled = reason
        self._recordings.clear()
        log.warning("kiln: %s runs without CUDA graphs (mode='reduce-overhead'): %s", self.name, reason)

    def forward(self, *args: Any) -> Any:
        if self._disabled is not None or torch.cuda.is_current_stream_capturing():
            return self.module(*args)
        key = _layout_key(args)
        recording = self._recordings.get(key)
        if recording is not None and all(args[i].data_ptr() == ptr for i, ptr in recording.pinned):
            return self._replay(recording, args)
        if key not in self._seen:  # the warm-up call: which inputs keep their storage?
            self._seen[key] = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
            return self.module(*args)
        if len(self._recordings) >= MAX_RECORDINGS:
            self._disable(f"its inputs changed layout or storage more than {MAX_RECORDINGS} times")
            return self.module(*args)
        try:
            recording = self._record(args, self._seen[key])
        except RuntimeError as exc:  # a CPU sync or another operation a recording refuses
            self._disable(f"recording failed ({type(exc).__name__}: {str(exc).splitlines()[0]})")
            return self.module(*args)
        self._recordings[key] = recording
        return self._replay(recording, args)

    def _record(self, args: Sequence[Any], warmup_ptrs: Sequence[int | None]) -> _Recording:
        pinned = tuple((i, a.data_ptr()) for i, a in enumerate(args)
                       if isinstance(a, torch.Tensor) and a.data_ptr() == warmup_ptrs[i])
        pinned_positions = {i for i, _ in pinned}
        copied = tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in pinned_positions)
        inputs = [a.clone() if i in copied else a for i, a in enumerate(args)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # one plain run on the static inputs: lazy initializations happen here
            self.module(*inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self.module(*inputs)
        log.info("kiln: %s recorded as a CUDA graph (%d inputs copied in, %d read in place)",
                 self.name, len(copied), len(pinned))
        return _Recording(graph, inputs, copied, pinned, outputs)

    @staticmethod
    def _replay(recording: _Recording, args: Sequence[Any]) -> Any:
        for i in recording.copied:
            recording.inputs[i].copy_(args[i])
        recording.graph.replay()
        return torch.utils._pytree.tree_map(
            lambda o: o.clone(memory_format=torch.preserve_format) if isinstance(o, torch.Tensor) else o,
            recording.outputs)


def reduce_overhead(module: torch.nn.Module, example_inputs: Sequence[Any], name: str,
                    writes_inputs: bool) -> torch.nn.Module:
    """`module` replayed through CUDA graphs, or `module` itself (saying why) when it cannot be;
    `writes_inputs`: whether its Dynamo graph writes into its inputs (`writes_to_inputs`)."""
    reason = cannot_record_reason(example_inputs, writes_inputs)
    if reason is not None:
        log.warning("kiln: %s runs without CUDA graphs (mode='reduce-overhead'): %s", name, reason)
        return module
    return CudaGraphed(module, name)
