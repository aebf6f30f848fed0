"""`partition`: outline the maximal supported regions of an FX graph into submodules."""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator
from typing import Any

import torch.fx as fx

from .build import BuiltRegion, build_partitioned
from .effects import cached_op_name, op_name
from .meta import REPORT_KEY
from .predicates import NodePredicate, as_supported
from .regions import SPLIT_CYCLE, SPLIT_MIN_SIZE, RegionPlan, plan_regions
from .report import PartitionReport, RegionSplit, UnsupportedNode, summarize_region

logger = logging.getLogger(__name__)


def partition(gm: fx.GraphModule, supported: NodePredicate, *, min_size: int = 1) -> fx.GraphModule:
    """Return a new GraphModule where each supported region is a `call_module` submodule.

    Args:
        gm: any FX GraphModule (Torch IR, ATen IR, prims); it is not modified.
        supported: `node -> bool`, asked about call_function / call_method / call_module
            nodes (see `supports_ops`, `supports_dtypes`, `supports_devices`, `Supported`).
            Nodes that mutate an input never go in a region, whatever it answers;
            `operator.getitem` of a multi-output node follows its producer.
        min_size: regions with fewer call nodes than this stay as plain nodes.

    Returns:
        A GraphModule whose regions are submodules `kiln_region_0`, `kiln_region_1`, ... (plain
        GraphModules taking the values they read from outside and returning a tuple of the
        values used outside), called in a topological order; every other node is kept with its
        name, target, args and meta. Its `meta["kiln_partition"]` is a `PartitionReport`.
        The parent and the regions generate their Python code on first call or `.code`
        access, not here: a backend that compiles the regions never pays for theirs.
    """
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"partition expects a torch.fx.GraphModule, got {type(gm).__name__}")
    if not isinstance(min_size, int) or min_size < 1:
        raise ValueError(f"partition: min_size must be an int >= 1, got {min_size!r}")
    predicate = as_supported(supported)
    with _gc_paused():
        plan = plan_regions(gm.graph, predicate, min_size)
        new_gm, built = build_partitioned(gm, plan)
    names: dict[Any, str] = {}
    report = PartitionReport(
        regions=tuple(
            summarize_region(r.name, r.nodes, r.inputs, r.outputs, names) for r in built
        ),
        unsupported=tuple(
            UnsupportedNode(n.name, cached_op_name(n, names), reason)
            for n, reason in plan.unsupported
        ),
        dissolved=tuple(
            summarize_region(f"dissolved_{i}", nodes, names=names)
            for i, nodes in enumerate(plan.dissolved)
        ),
        min_size=min_size,
        predicate=repr(predicate),
        splits=_splits(plan, built, min_size),
    )
    new_gm.meta[REPORT_KEY] = report
    logger.debug("%s", report)
    return new_gm


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # Building a graph allocates hundreds of thousands of objects that all stay alive; the
    # cyclic collector would rescan them over and over (superlinear on 100k-node graphs).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _splits(plan: RegionPlan, built: list[BuiltRegion], min_size: int) -> tuple[RegionSplit, ...]:
    name_of_first = {r.nodes[0]: r.name for r in built}
    dissolved = {group[0]: f"dissolved_{i}" for i, group in enumerate(plan.dissolved)}
    names = [name_of_first.get(g[0]) or dissolved[g[0]] for g in plan.groups]
    reasons = dict(plan.unsupported)
    splits = []
    for cause in plan.splits:
        via = f"{cause.via.name} ({op_name(cause.via)}: {reasons.get(cause.via, 'ordering')})"
        if cause.reason == SPLIT_CYCLE and cause.edge is not None:
            producer, user = cause.edge
            detail = f"{user.name} reads {producer.name} directly and also through {via}"
        else:
            detail = via
        earlier = None if cause.earlier is None else names[cause.earlier]
        splits.append(RegionSplit(names[cause.later], earlier, cause.reason, detail))
    for name, group in zip(names, plan.groups):
        if len(group) < min_size:
            detail = f"{len(group)} nodes < min_size={min_size}"
            splits.append(RegionSplit(name, None, SPLIT_MIN_SIZE, detail))
    return tuple(splits)
