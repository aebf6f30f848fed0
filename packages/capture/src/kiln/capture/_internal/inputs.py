"""``InputSpec``: what one graph input is (shape, strides, dtype, symbolic sizes, origin).

Read from the placeholder's fake value (so sizes keep their symbols, ``s77``), else from the
example input; ``source`` is where Dynamo got the value (``L['x']``,
``L['self']._modules['linear']._parameters['weight']``), when known.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kiln.capture._internal.meta import node_value

log = logging.getLogger(__name__)

_DTYPE_SHORT = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
    torch.complex64: "c64",
    torch.complex128: "c128",
}
_SOURCE_PART = re.compile(r"\._(?:modules|parameters|buffers)\['([^']+)'\]")
_ROOT = re.compile(r"^L\['[^']+'\]")


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One graph input. ``kind`` is ``"tensor"``, ``"int"``, ``"float"``, ``"bool"`` or a
    type name; ``shape``/``stride`` hold ints and, for symbolic sizes, their expression
    text; ``dtype``/``device``/``requires_grad`` are None/None/False for non-tensors;
    ``is_parameter`` is True for a module parameter or buffer that Dynamo made an input."""

    name: str
    kind: str
    shape: tuple[int | str, ...] = ()
    stride: tuple[int | str, ...] = ()
    dtype: torch.dtype | None = None
    device: str | None = None
    requires_grad: bool = False
    source: str | None = None
    symbol: str | None = None
    is_parameter: bool = False

    @property
    def module_path(self) -> str | None:
        """``encoder.layer.0.weight`` for a parameter or buffer input, else None."""
        if not self.is_parameter:
            return None
        return ".".join(_SOURCE_PART.findall(_ROOT.sub("", self.source or "")))

    @property
    def type_text(self) -> str:
        """``f32[s77, 3]`` for a tensor (strides shown when not contiguous), ``int s77``, ..."""
        if self.kind != "tensor":
            return f"{self.kind} {self.symbol}" if self.symbol else self.kind
        dtype = _DTYPE_SHORT.get(self.dtype, str(self.dtype).removeprefix("torch."))
        text = f"{dtype}[{', '.join(str(d) for d in self.shape)}]"
        expected = _contiguous_strides(self.shape)
        if expected is not None and self.stride != expected:
            text += f" stride=({', '.join(str(s) for s in self.stride)})"
        return text

    def __str__(self) -> str:
        return f"{self.name}: {self.type_text}"


def describe_inputs(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    sources: Sequence[str | None] = (),
) -> tuple[InputSpec, ...]:
    """One ``InputSpec`` per placeholder of ``gm``."""
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    specs = []
    for position, node in enumerate(placeholders):
        found, value = node_value(node.meta)
        if not found and position < len(example_inputs):
            value = example_inputs[position]
        source = sources[position] if position < len(sources) else None
        example = example_inputs[position] if position < len(example_inputs) else None
        spec = _describe(node.name, value, source)
        if _is_module_state(source) or isinstance(example, torch.nn.Parameter):
            spec = dataclasses.replace(spec, is_parameter=True)
        specs.append(spec)
    return tuple(specs)


def placeholder_sources(gm: torch.fx.GraphModule) -> tuple[str | None, ...]:
    """Dynamo's source name of each placeholder (``L['x']``), None where it set none."""
    names = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        source = getattr(node, "_dynamo_source", None)
        name = getattr(source, "name", None) if source is not None else None
        names.append(name() if callable(name) else name)
    return tuple(names)


def _is_module_state(source: str | None) -> bool:
    return bool(source) and ("._parameters[" in source or "._buffers[" in source)


def _describe(name: str, value: Any, source: str | None) -> InputSpec:
    if isinstance(value, torch.Tensor):
        return InputSpec(
            name=name,
            kind="tensor",
            shape=tuple(_dim(d) for d in value.shape),
            stride=tuple(_dim(s) for s in value.stride()),
            dtype=value.dtype,
            device=str(value.device),
            requires_grad=bool(value.requires_grad),
            source=source,
        )
    kinds = {torch.SymInt: "int", torch.SymFloat: "float", torch.SymBool: "bool"}
    if type(value) in kinds:
        return InputSpec(name, kinds[type(value)], source=source, symbol=str(value.node.expr))
    return InputSpec(name, type(value).__name__, source=source)


def _dim(value: int | torch.SymInt) -> int | str:
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        return int(expr) if expr.is_number else str(expr)
    return int(value)


def _contiguous_strides(shape: tuple[int | str, ...]) -> tuple[int | str, ...] | None:
    if not all(isinstance(d, int) for d in shape):
        return None  # symbolic: strides print only when they are not the obvious ones
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
