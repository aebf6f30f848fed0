"""The FX metadata kiln.partition reads and writes.

Reads
    node.meta["val"] (or, when absent, node.meta["example_value"] as Dynamo writes it)
        The (fake) value a node produces: a tensor, a SymInt, or a tuple/list of them.
        `supports_dtypes` / `supports_devices` inspect it; a node without it is not
        supported by those predicates. `operator.getitem` nodes whose producer's "val" is a
        tuple or list follow their producer into (or out of) a region. The pattern matcher
        reads it to trace ATen replacements per match, to tell symbolic scalars from
        tensors when `literals="any"`, and to propagate values to new nodes.

Writes (partition)
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

Writes (replace / PatternSet.apply)
    Nodes inserted by a replacement
        meta["kiln_pattern"]: the name of the pattern they replace. `PROVENANCE_KEYS`
        ("stack_trace", "nn_module_stack", "source_fn_stack", ...) copied from the node
        they replace (a replacement output) or from the match's anchor (other new nodes).
        meta["val"]: from the make_fx trace of the replacement (ATen patterns), else run
        on fake values; a replacement output without one gets the replaced node's "val".
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx

VAL = "val"
EXAMPLE_VALUE = "example_value"
REPORT_KEY = "kiln_partition"
REGION_PREFIX = "kiln_region_"
PLACEHOLDER_META_KEYS = ("val", "tensor_meta", "example_value", "stack_trace")
PATTERN_KEY = "kiln_pattern"
PROVENANCE_KEYS = (
    "stack_trace",
    "nn_module_stack",
    "source_fn_stack",
    "seq_nr",
    "from_node",
    "original_aten",
    "fwd_nn_module_stack",
    "fwd_source_fn_stack",
    "custom",
)


def has_value(node: fx.Node) -> bool:
    """Whether `node` carries its (fake) value: meta["val"] or Dynamo's "example_value"."""
    return VAL in node.meta or EXAMPLE_VALUE in node.meta


def node_value(node: fx.Node) -> Any:
    """meta["val"], else meta["example_value"], else None."""
    meta = node.meta
    return meta[VAL] if VAL in meta else meta.get(EXAMPLE_VALUE)
