"""The FX metadata kiln.partition reads and writes.

Reads
    node.meta["val"]
        The (fake) value a node produces: a tensor, a SymInt, or a tuple/list of them.
        `supports_dtypes` / `supports_devices` inspect it; a node without it is not
        supported by those predicates. `operator.getitem` nodes whose producer's "val" is a
        tuple or list follow their producer into (or out of) a region.

Writes
    GraphModule.meta["kiln_partition"]
        On the returned GraphModule: the `PartitionReport` of the run.
    Nodes copied into a region submodule
        Keep their whole `meta` (shallow copy: "val", "tensor_meta", "stack_trace", ...).
    Placeholders of a region submodule
        Get the producer's `PLACEHOLDER_META_KEYS` ("val", "tensor_meta", "example_value",
        "stack_trace"), so each submodule is a self-describing FX graph.
    The `call_module` node of a region in the parent graph
        meta["val"]: the tuple of the region outputs' "val" (when every output has one).
    The `operator.getitem` nodes that unpack a region in the parent graph
        A copy of the meta of the node they stand for (they also keep its name).
    Nodes kept outside regions
        Keep their meta (shallow copy).
"""

from __future__ import annotations

VAL = "val"
REPORT_KEY = "kiln_partition"
REGION_PREFIX = "kiln_region_"
PLACEHOLDER_META_KEYS = ("val", "tensor_meta", "example_value", "stack_trace")
