"""Choosing the fake mode for a trace and turning example inputs into fake values.

Inside a Dynamo backend the example inputs are real tensors plus the ``SymInt`` sizes Dynamo
chose, and ``detect_fake_mode`` finds Dynamo's fake mode through the tracing context.
``fake_mode.from_tensor`` then returns the very fake tensors Dynamo made (with its symbolic
sizes), so sizes and ``SymInt`` inputs share one ``ShapeEnv``. Standalone, a fresh mode with
static shapes is made (its ``ShapeEnv`` only serves data-dependent output sizes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch._guards
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from .errors import TraceError

log = logging.getLogger(__name__)

_SYMBOLIC_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool)
_PLAIN_SCALARS = (bool, int, float)


def fake_mode_for(example_inputs: Sequence[object]) -> tuple[FakeTensorMode, bool]:
    """The fake mode to trace under, and whether it was found (``False``: made here, static)."""
    try:
        detected = torch._guards.detect_fake_mode(list(example_inputs))
    except AssertionError as error:
        raise TraceError(
            "kiln.autograd_trace: the example inputs are FakeTensors of different fake modes; "
            "make them all with one FakeTensorMode"
        ) from error
    if detected is not None:
        return detected, True
    shape_env = _shape_env_of_symbols(example_inputs)
    if shape_env is not None:
        return FakeTensorMode(shape_env=shape_env), True
    return FakeTensorMode(shape_env=ShapeEnv()), False


def fakeify_inputs(
    example_inputs: Sequence[object],
    placeholders: Sequence[torch.fx.Node],
    fake_mode: FakeTensorMode,
    *,
    static_shapes: bool,
) -> list[object]:
    """One fake value per example input; raises ``TraceError`` naming an unsupported input."""
    fakes: list[object] = []
    for value, placeholder in zip(example_inputs, placeholders, strict=True):
        if isinstance(value, torch.Tensor) and value.layout != torch.strided:
            raise TraceError(
                f"kiln.autograd_trace: input {placeholder.name!r} is a {value.layout} tensor; only "
                "strided (dense) tensors can be traced"
            )
        if isinstance(value, FakeTensor):
            fakes.append(value)
        elif isinstance(value, torch.Tensor):
            fakes.append(fake_mode.from_tensor(value, static_shapes=static_shapes or None))
        elif isinstance(value, _SYMBOLIC_SCALARS + _PLAIN_SCALARS):
            fakes.append(value)
        else:
            raise TraceError(
                f"kiln.autograd_trace: input {placeholder.name!r} is a {type(value).__name__}; "
                "only tensors, SymInt/SymFloat/SymBool and int/float/bool inputs can be traced"
            )
    log.debug("fake inputs: %s", fakes)
    return fakes


def _shape_env_of_symbols(example_inputs: Sequence[object]) -> ShapeEnv | None:
    for value in example_inputs:
        if isinstance(value, _SYMBOLIC_SCALARS):
            return value.node.shape_env
    return None


def detach_fake(value: torch.Tensor, *, clone: bool = False) -> torch.Tensor:
    """``value.detach()`` (or ``.clone()``) keeping the FakeTensor's memoized ``.item()``.

    Dynamo passes unspecialized floats (e.g. BatchNorm's momentum with ``dynamic=True``) as
    0-d tensors that the graph ``.item()``s; their fakes remember the SymFloat in ``item_memo``,
    which a plain detach or clone drops (``.item()`` would then be data-dependent).
    """
    result = value.clone() if clone else value.detach()
    memo = getattr(value, "item_memo", None)
    if memo is not None and isinstance(result, FakeTensor):
        result.item_memo = memo
    return result
