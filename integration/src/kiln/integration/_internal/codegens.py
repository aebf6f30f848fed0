"""Choosing a codegen for a graph: the one `KilnOptions.codegen` names, else the one serving the
graph's device, from the registry (`codegen_registry.py`), with its options built from the
backend's. A graph for the device a codegen is named after loads only that codegen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from kiln import loopir

from . import codegen_registry
from .options import KilnOptions


@dataclasses.dataclass(frozen=True, slots=True)
class Selected:
    """The codegen compiling one graph, and its options built from the backend's."""

    codegen: loopir.Codegen
    options: Any


def device_type(example_inputs: Sequence[Any], values: Sequence[Any] = ()) -> str:
    """The device type the graph's kernels are generated for: its inputs' one device type, or
    the one besides "cpu" (CPU tensors in a GPU graph, such as scalars compiled autograd passes,
    are then read by eager ATen ops only: the partitioner keeps nodes touching them out of
    regions). A graph with no tensor inputs (factories: torch.randint(..., device="cuda")) goes
    by the tensors it makes, `values` (Dynamo's example values of its nodes)."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if not tensors:
        tensors = [t for t in values if isinstance(t, torch.Tensor)]
    devices = sorted({t.device.type for t in tensors})
    accelerators = [d for d in devices if d != "cpu"]
    if len(accelerators) > 1:
        raise ValueError(f"graph inputs live on several devices ({', '.join(devices)})")
    return accelerators[0] if accelerators else "cpu"


def select(device: str, options: KilnOptions) -> Selected:
    """The codegen named by `options.codegen`, else the one serving `device` (the one named
    after it first), with its options built from the backend's."""
    codegens = codegen_registry.registered()
    if options.codegen is not None:
        codegen = codegens.get(options.codegen)
        if codegen is None:
            raise ValueError(f"no kiln codegen named {options.codegen!r}; registered under "
                             f"{codegen_registry.ENTRY_POINT_GROUP!r}: {', '.join(sorted(codegens))}")
        codegen.check_device(device)
    elif device in codegens and device in codegens[device].devices:  # first choice: loads no other codegen
        codegen = codegens[device]
    else:
        serving = sorted((name != device, name) for name, c in codegens.items() if device in c.devices)
        if not serving:
            raise ValueError(f"no kiln codegen serves device {device!r}; registered under "
                             f"{codegen_registry.ENTRY_POINT_GROUP!r}: {', '.join(sorted(codegens))}")
        codegen = codegens[serving[0][1]]
    return Selected(codegen, codegen.make_options(options.codegen_settings()))
