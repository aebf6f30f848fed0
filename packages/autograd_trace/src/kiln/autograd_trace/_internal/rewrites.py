"""Torch calls rewritten before functionalization because their ATen op hides a mutation.

``torch.nn.functional.batch_norm`` in training mode reaches ``aten.native_batch_norm``, whose
schema does not declare that it updates ``running_mean``/``running_var`` in place, so
functionalization passes it through and the graph silently mutates the buffers. Calling
``aten._native_batch_norm_legit`` (same math, mutation declared) instead lets
``torch.func.functionalize`` turn it into ``_native_batch_norm_legit_functional`` plus
``copy_`` write-backs into the buffers.

The rewrite is a ``TorchFunctionMode``, so it also reaches calls made inside the ``forward``
of ``call_module`` submodules, not only the graph's own call_function nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

log = logging.getLogger(__name__)


def _batch_norm_with_declared_update(
    input: torch.Tensor,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``F.batch_norm``, with the training-mode running-stat update visible to functionalize."""
    if not training or running_mean is None or running_var is None or input.dim() < 2:
        return F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    log.debug("batch_norm in training mode: tracing aten._native_batch_norm_legit")
    return torch.ops.aten._native_batch_norm_legit.default(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )[0]


def _torch_batch_norm_with_declared_update(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool = True,
) -> torch.Tensor:
    return _batch_norm_with_declared_update(
        input, running_mean, running_var, weight, bias, training, momentum, eps
    )


PRE_FUNCTIONALIZATION_REWRITES: dict[Callable[..., object], Callable[..., object]] = {
    F.batch_norm: _batch_norm_with_declared_update,
    torch.batch_norm: _torch_batch_norm_with_declared_update,
}


class DeclareHiddenMutations(TorchFunctionMode):
    """Routes the calls in ``PRE_FUNCTIONALIZATION_REWRITES`` to their rewrites."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        rewrite = PRE_FUNCTIONALIZATION_REWRITES.get(func)
        if rewrite is not None:
            return rewrite(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))
