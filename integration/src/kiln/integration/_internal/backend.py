"""The `kiln` torch.compile backend and `explain`."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import logging
import traceback
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch
import torch.fx as fx

from .boxed_inputs import FlatInputs, flatten_list_inputs, has_list_inputs
from .compiled_autograd import rewrite_accumulate_grad
from .cudagraphs import reduce_overhead, writes_to_inputs
from .lookup import look_up
from .options import KilnOptions
from .report import GraphReport, Report

log = logging.getLogger(__name__)
_graph_index = itertools.count()
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _compile(gm: fx.GraphModule, example_inputs: Sequence[Any], options: KilnOptions,
             sink: Callable[[GraphReport], None] | None, compiled_autograd: bool = False) -> torch.nn.Module:
    if has_list_inputs(example_inputs):  # compiled autograd's (inputs: list, *sizes)
        try:
            flat_gm, flat_inputs, lists, stolen = flatten_list_inputs(gm, example_inputs)
        except NotImplementedError as exc:
            return _run_eagerly(gm, exc, next(_graph_index), options, sink, compiled_autograd=True)
        rewrite_accumulate_grad(flat_gm)
        return FlatInputs(_compile(flat_gm, flat_inputs, options, sink, compiled_autograd=True), lists, stolen)
    index = next(_graph_index)
    try:
        looked_up = look_up(gm, example_inputs, options, index, on_backward=sink, compiled_autograd=compiled_autograd)
        if looked_up.hit is not None:
            module, report = looked_up.hit
        else:
            module, report = _pipeline().compile_graph(gm, example_inputs, options, looked_up, on_backward=sink,
                                                       compiled_autograd=compiled_autograd)
    except Exception as exc:
        return _run_eagerly(gm, exc, index, options, sink, compiled_autograd)
    if sink is not None:
        sink(report)
    return module


def _pipeline() -> ModuleType:
    """The compile pipeline, imported on the first cache miss rather than with the backend: it
    imports the tracing, decomposition and partitioning packages (a few tenths of a second),
    which a process whose graphs all come from the whole-graph cache never needs."""
    return importlib.import_module(f"{__package__}.pipeline")


def _run_eagerly(gm: fx.GraphModule, exc: Exception, index: int, options: KilnOptions,
                 sink: Callable[[GraphReport], None] | None, compiled_autograd: bool) -> torch.nn.Module:
    """Keep the user's program running, loudly: the graph runs as Dynamo captured it."""
    if not options.fallback:
        raise exc
    reason = f"kiln failed: {type(exc).__name__}: {exc}"
    log.warning("kiln: graph %d runs eagerly because %s\n%s", index, reason, traceback.format_exc())
    if sink is not None:
        sink(GraphReport(index, False, reason, (), (), 0, 0, "", (), compiled_autograd=compiled_autograd))
    return gm


def backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
            options: dict[str, Any] | KilnOptions | None = None) -> torch.nn.Module:
    """The `kiln` backend: `torch.compile(model, backend="kiln", options={...})`.

    Returns an nn.Module running generated kernels for what kiln supports and eager ATen
    kernels for the rest. `options` keys are the fields of `KilnOptions`.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} for the kiln backend; valid: {MODES[1:]}")
    graphs = mode in ("reduce-overhead", "max-autotune")  # as Inductor: max-autotune also replays CUDA graphs
    writes_inputs = graphs and writes_to_inputs(gm)  # before compiling rewrites gm
    ops = sum(n.op.startswith("call") for n in gm.graph.nodes)
    resolved = _repro_after_aot(KilnOptions.create(options))
    if mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        resolved = dataclasses.replace(resolved, autotune=True)
    module = _compile(gm, example_inputs, resolved, None)
    if graphs:
        return reduce_overhead(module, example_inputs, f"the compiled graph of {ops} ops", writes_inputs)
    return module


def _repro_after_aot(options: KilnOptions) -> KilnOptions:
    """``TORCHDYNAMO_REPRO_AFTER=aot``: Dynamo's after-AOT minifier wraps Inductor's compiler
    only, so for kiln it would do nothing. kiln's own works on its ATen graphs' compiled regions
    (`checked.py`): at ``TORCHDYNAMO_REPRO_LEVEL`` 2-4 each region is wrapped for its first call
    (``verify_calls=1``, forward and backward) and writes Dynamo's minifier launcher for its
    ATen graph when it raises (2), always (3), or when its outputs differ from eager's (4, which
    raises `RegionMismatchError` naming the region and the first kernel that differs); level 1
    warns that it writes nothing."""
    if torch._dynamo.config.repro_after != "aot":
        return options
    if torch._dynamo.config.repro_level >= 2:
        log.warning("kiln: TORCHDYNAMO_REPRO_AFTER=aot, level %d: each compiled region writes a minifier launcher "
                    "on its first call (see kiln.integration's README)", torch._dynamo.config.repro_level)
        return options if options.verify_calls else dataclasses.replace(options, verify_calls=1)
    warnings.warn("kiln: TORCHDYNAMO_REPRO_AFTER=aot at level 1 writes no repro for kiln; use levels 2-4, "
                  "TORCHDYNAMO_REPRO_AFTER=dynamo, or kiln.integration.bisect", stacklevel=3)
    return options


def explain(fn: Callable[..., Any], *args: Any, options: dict[str, Any] | KilnOptions | None = None,
            **kwargs: Any) -> Report:
    """Compile and run `fn(*args, **kwargs)` with kiln and report what happened to each graph.

    Resets Dynamo's caches first (so every graph is compiled afresh) and after.
    """
    reports: list[GraphReport] = []
    resolved = KilnOptions.create(options)

    def recording_backend(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> torch.nn.Module:
        return _compile(gm, example_inputs, resolved, reports.append)

    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=recording_backend)(*args, **kwargs)
    finally:
        torch._dynamo.reset()
    if not reports:
        warnings.warn(NO_GRAPH_WARNING, stacklevel=2)
    return Report(tuple(reports))


NO_GRAPH_WARNING = (
    "kiln: Dynamo handed kiln no graph, so nothing was compiled: every frame ran eagerly. Dynamo "
    "skips frames of torch's own code, e.g. the forward of a bare nn.Sequential inside "
    "DistributedDataParallel; give the model a forward of your own (or compile its blocks), and "
    "see TORCH_LOGS=graph_breaks,+dynamo for why frames were skipped.")
