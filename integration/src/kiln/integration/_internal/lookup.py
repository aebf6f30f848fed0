"""The first step of compiling a Dynamo graph: record it, choose its codegen, and look it up in
the whole-graph cache.

A hit ends here. This module (with the cache's own) imports none of the packages that trace,
decompose and partition graphs (`pipeline` does, and the backend imports it on the first miss),
so a process whose graphs all come from the cache does not pay for importing them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from kiln import capture

from . import codegens
from .graph_cache import GraphCache, open_cache
from .graph_key import GraphKey
from .options import KilnOptions
from .progress import Stages
from .report import GraphReport

log = logging.getLogger("kiln.integration._internal.pipeline")  # one logger for a graph's compile lines


@dataclasses.dataclass
class Lookup:
    """What looking a graph up found: the module and report of a hit, else what the compile
    that follows needs (its stage timer, the user's source line, codegen and cache entry)."""

    index: int
    stages: Stages
    location: str | None
    codegen: codegens.Selected
    cache: tuple[GraphCache, GraphKey] | None
    hit: tuple[torch.nn.Module, GraphReport] | None = None


def look_up(gm: fx.GraphModule, example_inputs: Sequence[Any], options: KilnOptions, index: int,
            on_backward: Callable[[GraphReport], None] | None = None, compiled_autograd: bool = False) -> Lookup:
    """Look `gm` up; ``on_backward`` gets a cached training graph's backward report on its
    first backward call (as it gets a compiled one's)."""
    stages = Stages(f"graph {index}")
    with stages.stage("capture"):
        captured = capture.CapturedGraph.from_backend(gm, example_inputs, index=index)
    location = str(captured.source) if captured.source is not None else None
    stages.where = location
    device = codegens.device_type(example_inputs, [n.meta.get("example_value") for n in gm.graph.nodes])
    codegen = codegens.select(device, options)
    with stages.stage("cache_key"):
        cache = open_cache(gm, example_inputs, options, codegen)
    found = Lookup(index, stages, location, codegen, cache)
    if cache is None:
        return found
    with stages.stage("cache_load"):
        loaded = cache[0].load(cache[1], gm, _cached_backward_reporter(index, location, on_backward))
    if loaded is not None:
        report = dataclasses.replace(loaded[1], index=index, location=location, stage_seconds=stages.seconds,
                                     cached=True, compiled_autograd=compiled_autograd)
        stages.summary("loaded from the whole-graph cache")
        log.info("kiln: %s", report)
        found.hit = (loaded[0], report)
    return found


def _cached_backward_reporter(index: int, location: str | None, on_backward: Callable[[GraphReport], None] | None
                              ) -> Callable[[GraphReport], None]:
    """Reports a cached training graph's backward (the stored compile's counts) on its first call."""
    def report_backward(stored: GraphReport) -> None:
        report = dataclasses.replace(stored, index=index, location=location, stage_seconds=(), cached=True)
        log.info("kiln: %s", report)
        if on_backward is not None:
            on_backward(report)
    return report_backward
