"""`partition`: outline the maximal supported regions of an FX graph into submodules."""

from __future__ import annotations

import logging

import torch.fx as fx

from .build import build_partitioned
from .effects import op_name
from .meta import REPORT_KEY
from .predicates import NodePredicate, as_supported
from .regions import plan_regions
from .report import PartitionReport, UnsupportedNode, summarize_region

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
    """
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"partition expects a torch.fx.GraphModule, got {type(gm).__name__}")
    if not isinstance(min_size, int) or min_size < 1:
        raise ValueError(f"partition: min_size must be an int >= 1, got {min_size!r}")
    predicate = as_supported(supported)
    plan = plan_regions(gm.graph, predicate, min_size)
    new_gm, built = build_partitioned(gm, plan)
    report = PartitionReport(
        regions=tuple(summarize_region(r.name, r.nodes, r.inputs, r.outputs) for r in built),
        unsupported=tuple(
            UnsupportedNode(n.name, op_name(n), reason) for n, reason in plan.unsupported
        ),
        dissolved=tuple(
            summarize_region(f"dissolved_{i}", nodes) for i, nodes in enumerate(plan.dissolved)
        ),
        min_size=min_size,
        predicate=repr(predicate),
    )
    new_gm.meta[REPORT_KEY] = report
    logger.debug("%s", report)
    return new_gm
