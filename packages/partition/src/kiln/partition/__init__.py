"""kiln.partition: a capability partitioner and a pattern matcher for FX graphs.

`partition(gm, supported)` outlines the maximal regions of nodes a backend supports into
`call_module` submodules, keeping the rest of the graph as it was. `verify(gm)` checks the
result. Predicates come from `supports_ops` / `supports_dtypes` / `supports_devices` /
`supports_tags` and compose with `&`, `|`, `~`.

`match(graph, pattern)`, `replace(graph, pattern, replacement)` and `PatternSet` find and
rewrite subgraphs in Torch IR, ATen IR and prims-level graphs alike; `check_replacement`
tests a replacement against its pattern on random inputs.
"""

from ._internal.check import ReplacementCheck, check_replacement
from ._internal.effects import is_collective
from ._internal.matcher import Match
from ._internal.partitioner import partition
from ._internal.pattern import Pattern
from ._internal.predicates import (
    Supported,
    supports_devices,
    supports_dtypes,
    supports_ops,
    supports_tags,
)
from ._internal.report import PartitionReport
from ._internal.rewrite import PatternSet, match, replace
from ._internal.verify import PartitionVerificationError, verify

__all__ = [
    "Match",
    "PartitionReport",
    "PartitionVerificationError",
    "Pattern",
    "PatternSet",
    "ReplacementCheck",
    "Supported",
    "check_replacement",
    "is_collective",
    "match",
    "partition",
    "replace",
    "supports_devices",
    "supports_dtypes",
    "supports_ops",
    "supports_tags",
    "verify",
]
