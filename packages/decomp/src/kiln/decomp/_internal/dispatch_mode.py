"""The dispatcher-level interception that applies a table while ``make_fx`` traces.

Why not ``make_fx(decomposition_table=...)`` alone: ops that are CompositeImplicitAutograd
(``linear``, ``layer_norm``, ``upsample_nearest2d``, ``matmul``...) have their
decomposition run by the dispatcher at the Autograd key, above any Python mode, so a
tracer never sees them and no table can keep them. ``decompose`` therefore traces with
the Autograd keys excluded (``torch._C._AutoDispatchBelowAutograd``): every op, composite
or not, then reaches the Python key, where ``TableDispatchMode`` sits on top of make_fx's
proxy mode and decides, op by op:

1. op kept by the table (``DecompTable.kept``) and composite: recorded whole as one node
   (its output values come from running it under the fake mode alone, untraced);
2. op with a table entry: the entry runs, under this mode again so the ops it emits are
   decided the same way (``NotImplemented`` from the entry falls through to 3/4);
3. composite op that autograd would have decomposed: its CompositeImplicitAutograd
   kernel runs, under this mode again (this is what the dispatcher would have done);
4. anything else: handed to the proxy mode, which records it.

Inside the bodies of higher-order ops (``cond``, ``while_loop``...) make_fx's own
decomposition table (the same table) applies instead: composite ops there are decomposed
even when kept.

torch.export's ``run_decompositions`` reaches the same goal by temporarily replacing the
Python kernels of every preserved op (global state); this mode changes nothing outside
the trace it is entered in.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._ops import OpOverload
from torch.fx.experimental.proxy_tensor import (
    disable_proxy_modes_tracing,
    get_proxy_mode,
    track_tensor_tree,
)
from torch.utils._python_dispatch import TorchDispatchMode

log = logging.getLogger(__name__)

_CIA = torch._C.DispatchKey.CompositeImplicitAutograd


def is_composite_implicit(op: OpOverload) -> bool:
    """Whether ``op`` has a CompositeImplicitAutograd kernel (C++ or Python)."""
    return _CIA in op.py_kernels or _has_cpp_composite_kernel(op)


@functools.lru_cache(maxsize=4096)
def _has_cpp_composite_kernel(op: OpOverload) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), _CIA)
    except RuntimeError:  # TorchScript-only ops (prim::device) are not in the dispatcher
        return False


def _has_backend_kernel(op: OpOverload, flat_args: Sequence[Any]) -> bool:
    """A composite op with its own kernel for an argument's device is not decomposed by
    autograd (the fused kernel runs in eager), so it is not decomposed here either."""
    for arg in flat_args:
        if not isinstance(arg, torch.Tensor):
            continue
        key = torch._C._dispatch_key_for_device(arg.device.type)
        backend = getattr(torch._C.DispatchKey, key, None)
        if backend is not None and torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), backend
        ):
            return True
    return False


class TableDispatchMode(TorchDispatchMode):
    """Applies ``table`` to every op dispatched while it is the innermost mode.

    ``kept``: ops recorded whole even when they are CompositeImplicitAutograd.
    Enter it inside the function make_fx traces, under ``below_autograd()``.
    """

    def __init__(
        self, table: Mapping[OpOverload, Callable[..., Any]], kept: frozenset[OpOverload]
    ) -> None:
        super().__init__()
        self.table = table
        self.kept = kept

    # Higher-order ops (cond, while_loop, ...) come here too; they are handed on to the
    # proxy mode, which traces their bodies with make_fx's own decomposition table.
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if not isinstance(func, OpOverload):
            return func(*args, **kwargs)
        composite = is_composite_implicit(func)
        if composite and func in self.kept:
            return _record_whole(func, args, kwargs)
        decomposition = self.table.get(func)
        if decomposition is not None:
            with self:
                out = decomposition(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if composite and not _has_backend_kernel(func, pytree.tree_leaves((args, kwargs))):
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


def _record_whole(func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Emit one graph node calling ``func``; its value comes from an untraced fake run."""
    proxy_mode = get_proxy_mode()
    if proxy_mode is None:  # not tracing: nothing to record into
        return func(*args, **kwargs)
    tracer = proxy_mode.tracer
    with disable_proxy_modes_tracing():
        out = func(*args, **kwargs)
    proxy_args, proxy_kwargs = pytree.tree_map(tracer.unwrap_proxy, (args, kwargs))
    proxy = tracer.create_proxy(
        "call_function", func, proxy_args, proxy_kwargs, name=func.overloadpacket.__name__
    )
    log.debug("kept %s whole", func)
    return track_tensor_tree(out, proxy, constant=None, tracer=tracer)


def below_autograd() -> Any:
    """Context excluding the Autograd dispatch keys, so composite ops reach the Python key."""
    return torch._C._AutoDispatchBelowAutograd()
