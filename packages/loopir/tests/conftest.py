"""Shared fixtures for loopir tests: trace with make_fx, lower, verify, compare against eager."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import KernelGraph, lower, verify


def lower_and_check(fn: Callable[..., Any], *args: Any, tracing_mode: str = "real",
                    run_args: tuple[Any, ...] | None = None, fuse_rows: bool = True,
                    row_temporaries: bool = False, **tolerances: Any) -> KernelGraph:
    """Trace `fn` on `args`, lower it, verify the kernel graph and compare it with eager on
    `run_args` (default: `args`). Dtypes must match exactly; NaNs must be in the same places."""
    gm = make_fx(fn, tracing_mode=tracing_mode)(*args)
    kg = lower(gm, fuse_rows=fuse_rows, row_temporaries=row_temporaries)
    verify(kg)
    check_recorded_decisions(kg)
    run_args = args if run_args is None else run_args
    torch.testing.assert_close(kg(*run_args), fn(*run_args), equal_nan=True, **tolerances)
    return kg


def check_recorded_decisions(kg: KernelGraph) -> None:
    """The row nodes and placements the scheduler recorded on each kernel are the ones its
    ranges give (what a kernel built by hand works out)."""
    for kernel in kg.kernels:
        assert kernel.rows is not None and kernel.placements is not None
        worked_out = dataclasses.replace(kernel, rows=None, placements=None)
        for node in kernel.nodes:
            assert kernel.is_row(node) == worked_out.is_row(node), node.name
            assert kernel.placement(node) == worked_out.placement(node), node.name


@pytest.fixture
def check() -> Callable[..., KernelGraph]:
    return lower_and_check


def kernel_reads(kg: KernelGraph) -> dict[str, list]:
    """buffer name -> index expressions it is loaded at, over every kernel of `kg`."""
    reads: dict[str, list] = {}
    for kernel in kg.kernels:
        for node in kernel.nodes:
            for access in node.accesses().reads:
                reads.setdefault(access.buffer, []).append(access.index)
    return reads


@pytest.fixture
def reads_of() -> Callable[[KernelGraph], dict[str, list]]:
    return kernel_reads
