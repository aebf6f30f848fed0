"""kiln.partition: a capability partitioner for FX graphs.

`partition(gm, supported)` outlines the maximal regions of nodes a backend supports into
`call_module` submodules, keeping the rest of the graph as it was. `verify(gm)` checks the
result. Predicates come from `supports_ops` / `supports_dtypes` / `supports_devices` and
compose with `&`, `|`, `~`.
"""

from ._internal.partitioner import partition
from ._internal.predicates import Supported, supports_devices, supports_dtypes, supports_ops
from ._internal.report import PartitionReport
from ._internal.verify import PartitionVerificationError, verify

__all__ = [
    "PartitionReport",
    "PartitionVerificationError",
    "Supported",
    "partition",
    "supports_devices",
    "supports_dtypes",
    "supports_ops",
    "verify",
]
