"""Filling the buffers a codegen allocates for kernel outputs, so that unwritten elements show.

A kernel must write every element of each output. One that misses some (a wrong mask, a
wrong index) leaves whatever the allocator's memory held: often zeros on a CPU, whose pages
come fresh from the system, and stale values on a GPU, whose caching allocator hands back
memory another tensor used. Such a bug can pass every CPU test and be wrong on a GPU. Filled
with NaN (or the largest integer), every unwritten element is visible wherever it is read.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def fill_requested(option: bool) -> bool:
    """Whether to fill new outputs: the codegen's option, or torch's deterministic mode with
    `torch.utils.deterministic.fill_uninitialized_memory` (as torch fills `torch.empty`)."""
    return option or (torch.are_deterministic_algorithms_enabled()
                      and torch.utils.deterministic.fill_uninitialized_memory)


def fill_uninitialized(tensors: Iterable[torch.Tensor]) -> None:
    """Fill each tensor as torch fills uninitialized memory: NaN for floating and complex
    dtypes, True for bool, the dtype's largest value for integers."""
    for tensor in tensors:
        if tensor.is_floating_point() or tensor.is_complex():
            tensor.fill_(float("nan"))
        elif tensor.dtype == torch.bool:
            tensor.fill_(True)
        else:
            tensor.fill_(torch.iinfo(tensor.dtype).max)
