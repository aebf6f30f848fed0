"""kiln.autograd_trace: trace Torch-IR FX graphs to functional ATen graphs.

Stage contract: a Torch-IR ``GraphModule`` (as Dynamo hands it to a backend) plus example
inputs in; a functional ATen ``GraphModule`` with the same calling convention out.
"""

from kiln.autograd_trace._internal.errors import TraceError, VerifyError
from kiln.autograd_trace._internal.inference import trace_inference
from kiln.autograd_trace._internal.verify import verify

__all__ = ["TraceError", "VerifyError", "trace_inference", "verify"]
