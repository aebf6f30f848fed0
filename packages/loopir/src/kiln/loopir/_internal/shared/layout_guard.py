"""`layout_guard`: one C++ call that tells whether a kernel's inputs are exactly the ones it last
ran on (same layout), for the per-call fast paths of codegen runtimes.

A static kernel (no size symbols) checks on every call that each input has the dtype, device,
sizes and strides it was generated for before it hands raw pointers to generated code. Done in
Python that is five attribute reads and compares per input: on a 2-core CPU host 2.8 us for an
8-input kernel whose generated code runs in 0.7 us (a 4-layer BERT training step at tiny sizes:
58 such calls). torch's `TensorGuards` (the C++ tensor check Dynamo's guards were built on)
compares the same properties, plus the Python type, `requires_grad` and the dispatch keys under
the current thread-local include/exclude sets, for all inputs in one call: 0.6 us there.

Its answer is only ever used as "the fast path may run": a False sends the caller to its own,
complete Python check, which accepts or names the mismatch as before. So a property it compares
that the kernel does not care about (a `Parameter` where the first call had a plain tensor, an
autocast region) costs the Python check, never a wrong result; and a torch without the class
(or with another constructor) gives None here, and callers keep their Python check alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

_TENSOR_GUARDS = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "TensorGuards", None)

LayoutGuard = Callable[..., bool]


def layout_guard(tensors: Sequence[Any]) -> LayoutGuard | None:
    """`guard(*inputs) -> bool`: True when `inputs` are as many tensors as `tensors`, each of
    the same Python type, dtype, device, sizes, strides, `requires_grad` and dispatch keys as
    the tensor at its position (data pointers are not compared: alignment is the caller's
    check); None when torch has no such check or `tensors` are not all plain dense tensors."""
    if _TENSOR_GUARDS is None or not tensors:
        return None
    if not all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout is torch.strided for t in tensors):
        return None
    try:
        # The sizes and strides must be given (one list per tensor: all static here); without
        # them the constructor does not fail cleanly.
        guards = _TENSOR_GUARDS(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                                dynamic_dims_strides=[list(t.stride()) for t in tensors])
        if not guards.check(*tensors):
            return None
    except (TypeError, RuntimeError, ValueError):
        return None
    return guards.check
