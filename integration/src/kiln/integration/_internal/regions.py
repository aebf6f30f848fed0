"""Compiling a partitioned graph's regions: each lowered to a kernel graph, then all built at once.

Lowering runs region by region (Python), on a copy of the region whose names do not depend on
where it sits in the graph (`canonical_copy`): equal regions, such as the layers of a
transformer, then lower to kernels of equal source. Building runs the codegen's `compile` for
every lowered region concurrently, in threads: for the C++ codegen that is one compiler process
per region, so a graph of several regions waits about as long as its slowest build rather than
their sum (the artifact cache is safe for concurrent builders). Repeated regions are built in a
second wave, after the first of each kind: they then find their source already compiled in the
codegen's content-hash cache and only load it (the cache, keyed by the whole source, decides
what is shared, so nothing is shared by mistake). Results, fallbacks and debug dumps stay in
region order. A region that fails to lower or build runs eagerly as a whole (or raises, with
``fallback=False``).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
from typing import Any

import torch.fx as fx

from kiln import loopir

from . import codegens
from .checked import CheckedRegion
from .debug import DebugDump
from .input_writes import WRITES_KEY
from .options import KilnOptions
from .private_outputs import PRIVATE_KEY
from .progress import Stages
from .report import FallbackNode

log = logging.getLogger(__name__)


class RegionResults:
    """What compiling a graph's regions produced, for its `GraphReport`."""

    def __init__(self) -> None:
        self.lowered: tuple[str, ...] = ()
        self.fallbacks: tuple[FallbackNode, ...] = ()
        self.kernels = 0
        self.externs = 0
        self.fusions: tuple = ()
        self.source = ""
        self.collectives: tuple[str, ...] = ()
        # by region name: {output position: input position} its kernels stored into the input
        self.stored_inputs: dict[str, dict[int, int]] = {}

    def merge(self, other: RegionResults) -> None:
        self.lowered += other.lowered
        self.fallbacks += other.fallbacks
        self.kernels += other.kernels
        self.externs += other.externs
        self.fusions += other.fusions
        self.collectives += other.collectives
        self.stored_inputs.update(other.stored_inputs)
        self.source = "\n".join(s for s in (self.source, other.source) if s)


def _regions(parted: fx.GraphModule) -> list[tuple[str, fx.GraphModule]]:
    called = [n.target for n in parted.graph.nodes if n.op == "call_module"]
    return [(name, parted.get_submodule(name)) for name in called]


def compile_regions(parted: fx.GraphModule, codegen: codegens.Selected, dump: DebugDump, stages: Stages,
                    check: bool, options: KilnOptions, prefix: str = "", output_views: bool = True) -> RegionResults:
    """Replace each region submodule of `parted` by its compiled module (see the module docstring).
    `output_views`: `loopir.LowerOptions.output_views` (False for the halves of a training graph)."""
    results = RegionResults()
    plugin = codegen.codegen
    errors = (loopir.LoweringError, NotImplementedError, *plugin.errors)
    lowered = []
    for name, region in _regions(parted):
        try:
            with stages.stage(f"{prefix}loopir:{name}"):
                kernel_graph = _lower(canonical_copy(region), plugin, options, check, output_views)
                dump.write(f"{prefix}{name}_kernel_graph", kernel_graph.__str__)
        except errors as exc:
            _region_fails(results, name, region, exc, options)
            continue
        lowered.append((name, region, kernel_graph))
    with stages.stage(f"{prefix}codegen_{plugin.name}"):
        built = _build_all([kernel_graph for _, _, kernel_graph in lowered], codegen)
    sources = []
    for (name, region, kernel_graph), (module, exc) in zip(lowered, built):
        if exc is not None:
            if not isinstance(exc, errors):
                raise exc
            _region_fails(results, name, region, exc, options)
            continue
        source = getattr(module.meta.get(plugin.artifacts_key), "source", "")
        dump.write(f"{prefix}{name}_kernels", source, plugin.source_suffix)
        if options.verify_calls:  # not a GraphModule: stays a call, not inlined
            module = CheckedRegion(name, module, region, kernel_graph.kernels, options.verify_calls,
                                   prefix.replace("_", " "))
        setattr(parted, name, module)
        results.stored_inputs[name] = loopir.stored_positions(kernel_graph.gm)
        results.lowered += tuple(str(n.target) for n in region.graph.nodes if n.op == "call_function")
        results.kernels += len(kernel_graph.kernels)
        results.externs += len(kernel_graph.externs)
        results.fusions += kernel_graph.decisions
        sources.append(f"// region {name}\n{source}")
    results.source = "\n".join(sources)
    return results


def canonical_copy(region: fx.GraphModule) -> fx.GraphModule:
    """`region` with names independent of its place in the graph: inputs ``in_0``, ``in_1``, ...
    and every other node named after its op (``view``, ``view_1``, ...), metadata kept."""
    graph = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    for node in region.graph.nodes:
        if node.op == "placeholder":
            copy = graph.placeholder(f"in_{len(copies)}")
        else:
            copy = graph.create_node(node.op, node.target, fx.node.map_arg(node.args, copies.__getitem__),
                                     fx.node.map_arg(node.kwargs, copies.__getitem__),
                                     name=re.sub(r"_\d+$", "", node.name), type_expr=node.type)
        copy.meta = dict(node.meta)
        copies[node] = copy
    canonical = fx.GraphModule(region, graph)
    canonical.meta = dict(region.meta)
    return canonical


def _lower(region: fx.GraphModule, plugin: loopir.Codegen, options: KilnOptions, check: bool,
           output_views: bool) -> loopir.KernelGraph:
    kernel_graph = loopir.lower(region, loopir.LowerOptions(
        options.lowerings, fuse_rows=plugin.capabilities.row_fusion,
        row_temporaries=plugin.capabilities.row_temporaries,
        round_low_precision=options.round_low_precision,
        recompute_cheap=plugin.capabilities.recompute_cheap,
        recompute_transcendental=plugin.capabilities.recompute_transcendental,
        split_reductions=plugin.capabilities.split_reductions, output_views=output_views,
        welford=plugin.capabilities.welford, input_writes=tuple(region.meta.get(WRITES_KEY, ())),
        private_outputs=tuple(region.meta.get(PRIVATE_KEY, ())),
        reuse_extern_outputs=plugin.capabilities.reuse_extern_outputs,
        scatter_into_dead_bases=plugin.capabilities.scatter_into_dead_bases,
        join_earlier_kernels=plugin.capabilities.join_earlier_kernels,
        join_sibling_reductions=plugin.capabilities.join_sibling_reductions))
    if check:
        loopir.verify(kernel_graph)
    return kernel_graph


def _build_all(kernel_graphs: list[loopir.KernelGraph], codegen: codegens.Selected
               ) -> list[tuple[Any, BaseException | None]]:
    """(module, None) or (None, the exception) per kernel graph, in order. Equal kernel graphs
    (repeated regions; `KernelGraph.key`) build after the first of their kind (module docstring)."""
    def build(kernel_graph: loopir.KernelGraph) -> tuple[Any, BaseException | None]:
        try:
            return codegen.codegen.compile(kernel_graph, codegen.options), None
        except Exception as exc:  # re-raised or reported by the caller, in region order
            return None, exc

    first_of_kind: dict[loopir.KernelGraph, int] = {}
    for position, kernel_graph in enumerate(kernel_graphs):
        first_of_kind.setdefault(kernel_graph, position)
    firsts = sorted(first_of_kind.values())
    repeats = sorted(set(range(len(kernel_graphs))) - set(firsts))
    built: dict[int, tuple[Any, BaseException | None]] = {}
    for wave in (firsts, repeats):
        built.update(zip(wave, _concurrently(build, [kernel_graphs[p] for p in wave])))
    return [built[p] for p in range(len(kernel_graphs))]


def _concurrently(build: Any, kernel_graphs: list[loopir.KernelGraph]) -> list[tuple[Any, BaseException | None]]:
    if len(kernel_graphs) <= 1:
        return [build(kg) for kg in kernel_graphs]
    workers = min(len(kernel_graphs), os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="kiln-build") as pool:
        return list(pool.map(build, kernel_graphs))


def _region_fails(results: RegionResults, name: str, region: fx.GraphModule, exc: BaseException,
                  options: KilnOptions) -> None:
    if not options.fallback:
        raise exc
    log.warning("kiln: region %s runs eagerly: %s", name, exc)
    results.fallbacks += tuple(FallbackNode(n.name, str(n.target), f"region failed to compile: {exc}")
                               for n in region.graph.nodes if n.op == "call_function")
