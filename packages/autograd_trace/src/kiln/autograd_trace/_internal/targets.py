"""What ``trace_joint`` / ``aot_compile`` trace: a GraphModule, an ``nn.Module`` or a function.

Each is turned into a ``TraceTarget``: a way to call it on (fake) user inputs plus the tensors
it reads from its module (parameters, buffers, tensor constants), which are lifted into extra
inputs so that gradients can flow to them and so that no real tensor is touched while tracing.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Sequence

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call

from .errors import TraceError
from .interpreter import TracingInterpreter
from .lifting import LiftedTensor, collect_lifted_tensors, fetch_attr

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class TraceTarget:
    """A callable to trace, its input names, and the module tensors it reads (lifted)."""

    fn: Callable[..., object]
    input_names: tuple[str, ...]
    lifted: tuple[LiftedTensor, ...]

    def call(self, inputs: Sequence[object], lifted_values: Sequence[torch.Tensor]) -> object:
        """Run the target on ``inputs`` with ``lifted_values`` in place of its module tensors."""
        tensors = {
            name: value
            for entry, value in zip(self.lifted, lifted_values, strict=True)
            for name in entry.names
        }
        if isinstance(self.fn, torch.fx.GraphModule):
            return TracingInterpreter(self.fn, tensors).run(*inputs)
        if isinstance(self.fn, torch.nn.Module):
            return functional_call(self.fn, tensors, tuple(inputs))
        return self.fn(*inputs)

    def current_lifted_values(self) -> list[torch.Tensor]:
        """The module's tensors as they are now (a parameter may have been replaced)."""
        if not isinstance(self.fn, torch.nn.Module):
            return []
        return [fetch_attr(self.fn, entry.names[0]) for entry in self.lifted]

    def __str__(self) -> str:
        kind = type(self.fn).__name__
        return f"TraceTarget({kind}, inputs={list(self.input_names)}, lifted={len(self.lifted)})"


def make_target(
    fn: Callable[..., object], num_inputs: int, fake_mode: FakeTensorMode
) -> TraceTarget:
    """Wrap ``fn`` (GraphModule, nn.Module or plain callable) taking ``num_inputs`` inputs."""
    if isinstance(fn, torch.fx.GraphModule):
        placeholders = [n for n in fn.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != num_inputs:
            raise TraceError(
                f"kiln.autograd_trace: the graph has {len(placeholders)} inputs "
                f"({', '.join(p.name for p in placeholders)}) but {num_inputs} example inputs "
                "were given; pass one example value per placeholder"
            )
        names = tuple(p.name for p in placeholders)
        return TraceTarget(fn, names, tuple(collect_lifted_tensors(fn, fake_mode)))
    if isinstance(fn, torch.nn.Module):
        names = _parameter_names(fn.forward, num_inputs)
        return TraceTarget(fn, names, tuple(collect_lifted_tensors(fn, fake_mode)))
    if callable(fn):
        return TraceTarget(fn, _parameter_names(fn, num_inputs), ())
    raise TraceError(
        f"kiln.autograd_trace: cannot trace a {type(fn).__name__}; pass a torch.fx.GraphModule, "
        "an nn.Module or a function of tensors"
    )


def _parameter_names(fn: Callable[..., object], num_inputs: int) -> tuple[str, ...]:
    """Positional parameter names of ``fn`` where they can be read, else ``arg0, arg1, ...``."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    positional = [
        p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(positional) >= num_inputs:
        return tuple(positional[:num_inputs])
    return tuple(f"arg{i}" for i in range(num_inputs))
