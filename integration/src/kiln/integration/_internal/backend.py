"""The `kiln` torch.compile backend and `explain`."""

from __future__ import annotations

import itertools
import logging
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from .boxed_inputs import FlatInputs, flatten_list_inputs, has_list_inputs
from .compiled_autograd import rewrite_accumulate_grad
from .options import KilnOptions
from .pipeline import compile_graph
from .report import GraphReport, Report

log = logging.getLogger(__name__)
_graph_index = itertools.count()
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _compile(gm: fx.GraphModule, example_inputs: Sequence[Any], options: KilnOptions,
             sink: Callable[[GraphReport], None] | None) -> torch.nn.Module:
    index = next(_graph_index)
    if has_list_inputs(example_inputs):  # compiled autograd's (inputs: list, *sizes)
        flat_gm, flat_inputs, lists, stolen = flatten_list_inputs(gm, example_inputs)
        rewrite_accumulate_grad(flat_gm)
        return FlatInputs(_compile(flat_gm, flat_inputs, options, sink), lists, stolen)
    try:
        module, report = compile_graph(gm, example_inputs, options, index)
    except Exception as exc:
        if not options.fallback:
            raise
        # Keep the user's program running, loudly: the graph runs as Dynamo captured it.
        reason = f"kiln failed: {type(exc).__name__}: {exc}"
        log.warning("kiln: graph %d runs eagerly because %s\n%s", index, reason, traceback.format_exc())
        module, report = gm, GraphReport(index, False, reason, (), (), 0, 0, "", ())
    if sink is not None:
        sink(report)
    return module


def backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
            options: dict[str, Any] | KilnOptions | None = None) -> torch.nn.Module:
    """The `kiln` backend: `torch.compile(model, backend="kiln", options={...})`.

    Returns an nn.Module running generated kernels for what kiln supports and eager ATen
    kernels for the rest. `options` keys are the fields of `KilnOptions`.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} for the kiln backend; valid: {MODES[1:]}")
    return _compile(gm, example_inputs, KilnOptions.create(options), None)


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
    return Report(tuple(reports))
