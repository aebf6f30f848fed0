"""Choosing a codegen: by device type, through the `kiln.codegen` entry-point group.

kiln's own codegens register `cpu` (codegen_cpp) and `cuda` (codegen_triton); a third party
adds a device by registering its own `compile(kernel_graph, options=None)` under that group.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kiln import codegen_cpp, codegen_triton

from .options import KilnOptions

ENTRY_POINT_GROUP = "kiln.codegen"


@dataclasses.dataclass(frozen=True, slots=True)
class Codegen:
    name: str
    compile: Callable[..., torch.nn.Module]
    options: Any  # the codegen's own options object, or None for third-party codegens
    source_key: str  # where the codegen leaves its artifacts in module.meta


@functools.lru_cache(maxsize=1)
def registered() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def device_type(example_inputs: Sequence[Any]) -> str:
    devices = sorted({t.device.type for t in example_inputs if isinstance(t, torch.Tensor)})
    if len(devices) > 1:
        raise ValueError(f"graph inputs live on several devices ({', '.join(devices)})")
    return devices[0] if devices else "cpu"


def select(device: str, options: KilnOptions) -> Codegen:
    """The codegen for `device` (or `options.codegen` when set), with kiln's options mapped."""
    name = options.codegen or device
    if name == "cpu":
        return Codegen("cpu", codegen_cpp.compile, options.cpp(), "kiln_cpp")
    if name == "cuda":
        if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("codegen='cuda' on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 "
                             "before triton is imported")
        return Codegen("cuda", codegen_triton.compile, options.triton(), "kiln_triton")
    if name in registered():
        return Codegen(name, registered()[name].load(), None, f"kiln_{name}")
    known = sorted({"cpu", "cuda", *registered()})
    raise ValueError(f"no kiln codegen for {name!r}; registered under {ENTRY_POINT_GROUP!r}: {', '.join(known)}")
