"""FX ``node.meta`` keys that kiln.autograd_trace reads and writes.

Reads (on the input Torch-IR graph):

- ``stack_trace``: user source of the node (Dynamo records it); quoted in ``TraceError``
  messages and copied onto every ATen node the node turns into.
- ``nn_module_stack``, ``source_fn_stack``, ``torch_fn`` and the other fields that
  ``torch.fx.proxy`` copies while ``torch.fx.traceback.preserve_node_meta()`` is on: copied
  onto the ATen nodes made from the node.
- ``example_value`` is deliberately *not* read: inside a Dynamo backend the fake inputs come
  from ``fake_mode.from_tensor`` on the example inputs, so every value belongs to one fake mode.

Writes (on the output ATen graph):

- ``val``: on every placeholder, get_attr of a tensor and call_function node: a ``FakeTensor``
  (sizes may be ``SymInt``), a ``SymInt``/int for size arithmetic, or a list of those for
  multi-output ops. Written by ``make_fx``; written here for get_attr nodes (the fake of the
  lifted tensor or constant) and for placeholders of plain int/float/bool inputs (the value).
- ``stack_trace``, ``nn_module_stack``, ``source_fn_stack``, ``from_node`` and friends:
  carried over from the source node as described above. In joint graphs the backward ops
  made by the autograd engine carry no user stack trace.
- ``kiln_recomputed``: ``True`` on the nodes of a backward graph (from ``partition_joint``)
  that recompute a forward value instead of reading a saved one.

Graph-level (``gm.meta``) on the forward graphs ``aot_compile`` hands its forward compiler:

- ``input_mutations`` (``INPUT_MUTATIONS``): ``((output position, input position), ...)``, the
  mutations the compiler may write into the inputs itself (see ``runtime.py``); a compiled
  forward that did lists those output positions in its ``inputs_written`` attribute
  (``WRITTEN_ATTRIBUTE``).
- ``internal_outputs`` (``INTERNAL_OUTPUTS``): the output positions the runtime never hands to
  the user (mutated inputs' new values, tensors and sizes saved for the backward): no user
  modifies them in place, so a compiler need not give them storage of their own.

Joint, forward and backward graphs (``trace_joint`` / ``partition_joint``) carry ``val`` on
every placeholder (tangents included) and every tensor- or size-producing node, like
``trace_inference`` output.
"""

from __future__ import annotations

import logging

import torch.fx

log = logging.getLogger(__name__)

VAL = "val"
INPUT_MUTATIONS = "input_mutations"
WRITTEN_ATTRIBUTE = "inputs_written"
INTERNAL_OUTPUTS = "internal_outputs"
STACK_TRACE = "stack_trace"
NN_MODULE_STACK = "nn_module_stack"
RECOMPUTED = "kiln_recomputed"


def user_source_line(node: torch.fx.Node) -> str | None:
    """The innermost ``File ..., line N`` frame of ``node``'s stack trace with its code line."""
    trace = node.meta.get(STACK_TRACE)
    if not trace:
        return None
    lines = [line for line in trace.rstrip().splitlines() if line.strip()]
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].lstrip().startswith("File "):
            frame = [lines[index].strip()]
            if index + 1 < len(lines) and not lines[index + 1].lstrip().startswith("File "):
                frame.append("    " + lines[index + 1].strip())
            return "\n".join(frame)
    return lines[-1].strip()


def describe_node(node: torch.fx.Node) -> str:
    """``'name' (op target)`` for error messages, with the target written as a user reads it."""
    if node.op == "call_function":
        what = (
            torch.fx.node._get_qualified_name(node.target) if callable(node.target) else node.target
        )
    elif node.op == "call_method":
        what = f"Tensor.{node.target}"
    elif node.op == "call_module":
        what = f"module {node.target!r}"
    else:
        what = str(node.target)
    return f"node {node.name!r} ({node.op} {what})"
