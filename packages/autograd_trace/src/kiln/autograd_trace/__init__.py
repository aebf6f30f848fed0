"""kiln.autograd_trace: trace Torch-IR FX graphs to functional ATen graphs, for inference and
for training (joint forward+backward, partitioned, run under PyTorch autograd).

Stage contract: a Torch-IR ``GraphModule`` (as Dynamo hands it to a backend) plus example
inputs in; functional ATen ``GraphModule``s out (one for inference; a joint graph, split into
forward and backward graphs, for training), and a runtime that stitches compiled forward and
backward graphs back into autograd.
"""

import importlib
from typing import Any

from kiln.autograd_trace._internal.errors import TraceError, VerifyError

__all__ = [
    "AotCompiled",
    "INPUT_MUTATIONS",
    "INTERNAL_OUTPUTS",
    "JointGraph",
    "Partition",
    "RuntimePlan",
    "TraceError",
    "VerifyError",
    "WRITTEN_ATTRIBUTE",
    "aot_compile",
    "partition_joint",
    "trace_inference",
    "trace_joint",
    "verify",
]

# Each name's module is imported on first use: tracing imports more of torch's machinery than
# running a compiled graph, and a process loading its graphs from kiln's whole-graph cache
# (`AotCompiled.from_plan`) should pay only for what it calls.
_ON_FIRST_USE = {
    "trace_inference": "._internal.inference", "JointGraph": "._internal.joint", "trace_joint": "._internal.joint",
    "Partition": "._internal.partitioner", "partition_joint": "._internal.partitioner",
    "RuntimePlan": "._internal.plan", "AotCompiled": "._internal.runtime", "aot_compile": "._internal.runtime",
    "INPUT_MUTATIONS": "._internal.meta", "INTERNAL_OUTPUTS": "._internal.meta",
    "WRITTEN_ATTRIBUTE": "._internal.meta",
    "verify": "._internal.verify",
}


def __getattr__(name: str) -> Any:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(importlib.import_module(_ON_FIRST_USE[name], __name__), name)
    return value
