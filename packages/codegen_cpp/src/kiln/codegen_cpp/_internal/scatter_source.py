"""C++ for loopir's `Scatter` nodes (scatter, scatter_add/reduce, index_put): one statement per
source element that stores or combines it into the node's buffer.

The node's kernel is one sequential loop over the source elements, in order (function_source
emits it as a scan's loop), so accumulation is deterministic and matches eager's CPU kernels
bit for bit: sums and products in the buffer's dtype in source order, max/min propagating
NaN (scatter_reduce's amax/amin), bool sums and products as or/and. bfloat16/float16 elements
combine in float32 and round once per element (on store), as eager's CPU kernels do.
"""

from __future__ import annotations

import torch

from .low_precision import LOW_PRECISION, from_storage, to_storage

_COMBINE = {"sum": "({0} + {1})", "prod": "({0} * {1})", "max": "kiln_max({0}, {1})", "min": "kiln_min({0}, {1})"}
_BOOL_COMBINE = {"sum": "({0} || {1})", "prod": "({0} && {1})", "max": "({0} || {1})", "min": "({0} && {1})"}


def scatter_statement(pointer: str, index: str, value: str, mode: str, dtype: torch.dtype,
                      outside_flags: list[str]) -> list[str]:
    """`pointer[index]` updated with `value` by `mode` (ops.SCATTER_MODES), skipped when one of
    `outside_flags` (the index's failed range checks) is set."""
    element = f"{pointer}[{index}]"
    if mode == "store":
        new = value
    else:
        old = from_storage(dtype, element) if dtype in LOW_PRECISION else element
        combine = _BOOL_COMBINE if dtype == torch.bool else _COMBINE
        new = combine[mode].format(old, value)
    stored = to_storage(dtype, new) if dtype in LOW_PRECISION else new
    statement = f"{element} = {stored};"
    if outside_flags:
        statement = f"if (!({' || '.join(outside_flags)})) {statement}"
    return [statement]
