"""kiln.autograd_trace: trace Torch-IR FX graphs to functional ATen graphs, for inference and
for training (joint forward+backward, partitioned, run under PyTorch autograd).

Stage contract: a Torch-IR ``GraphModule`` (as Dynamo hands it to a backend) plus example
inputs in; functional ATen ``GraphModule``s out (one for inference; a joint graph, split into
forward and backward graphs, for training), and a runtime that stitches compiled forward and
backward graphs back into autograd.
"""

from kiln.autograd_trace._internal.errors import TraceError, VerifyError
from kiln.autograd_trace._internal.inference import trace_inference
from kiln.autograd_trace._internal.joint import JointGraph, trace_joint
from kiln.autograd_trace._internal.partitioner import Partition, partition_joint
from kiln.autograd_trace._internal.plan import RuntimePlan
from kiln.autograd_trace._internal.runtime import AotCompiled, aot_compile
from kiln.autograd_trace._internal.verify import verify

__all__ = [
    "AotCompiled",
    "JointGraph",
    "Partition",
    "RuntimePlan",
    "TraceError",
    "VerifyError",
    "aot_compile",
    "partition_joint",
    "trace_inference",
    "trace_joint",
    "verify",
]
