"""Running a Torch-IR graph node by node under make_fx, with lifted tensors and clear errors."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx
from torch.func import functional_call

from .errors import TraceError
from .meta import describe_node, user_source_line

log = logging.getLogger(__name__)

_HINT = (
    "If the op has no FakeTensor/meta kernel or functionalization rule, register one with "
    "torch.library, or pass a decomposition for it in `decompositions`."
)


class TracingInterpreter(torch.fx.Interpreter):
    """Interprets ``gm`` reading lifted tensors (fake) in place of its real attributes.

    Each node runs under ``torch.fx.Interpreter``'s current-meta context, so with
    ``preserve_node_meta()`` on, the ATen nodes it turns into inherit its stack trace and
    module stack. A failure is re-raised as ``TraceError`` naming the node.
    """

    def __init__(self, gm: torch.fx.GraphModule, lifted: Mapping[str, torch.Tensor]) -> None:
        super().__init__(gm)
        self.lifted = dict(lifted)

    def run_node(self, n: torch.fx.Node) -> Any:
        try:
            return super().run_node(n)
        except TraceError:
            raise
        except Exception as error:
            raise TraceError(failure_message(n, error)) from error

    def get_attr(self, target: str, args: tuple, kwargs: dict) -> Any:
        if target in self.lifted:
            return self.lifted[target]
        return super().get_attr(target, args, kwargs)

    def call_module(self, target: str, args: tuple, kwargs: dict) -> Any:
        prefix = target + "."
        tensors = {
            name[len(prefix) :]: value
            for name, value in self.lifted.items()
            if name.startswith(prefix)
        }
        if not tensors:
            return super().call_module(target, args, kwargs)
        return functional_call(self.fetch_attr(target), tensors, args, kwargs)


def failure_message(node: torch.fx.Node, error: BaseException) -> str:
    lines = [
        f"kiln.autograd_trace: could not trace {describe_node(node)} to functional ATen: "
        f"{type(error).__name__}: {_first_line(error)}"
    ]
    source = user_source_line(node)
    if source:
        lines.append("  user code: " + source.replace("\n", "\n  "))
    lines.append("  " + _HINT)
    return "\n".join(lines)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"
