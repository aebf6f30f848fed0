"""`fast_launch`: one Python frame from a kernel call to torch's C++ launcher.

`TritonKernel.__call__` handles every case: size symbols, run-time checks, scatter bases,
autotuning, filling uninitialized outputs, devices, launch hooks, Triton's own launcher. A call
of a static kernel (no size symbols) whose launch went through `StaticLaunch` once has one plan
and one compiled kernel; per call it only needs to confirm that the inputs are the ones that
kernel was specialized for, allocate its outputs and launch. The closure built here does
exactly that, in one frame: measured on an H200's host (tools/host_overhead.py, BENCHMARKS.md),
the five frames of the general path (`__call__`, `launch_plan`, `DirectLauncher.launch`,
`_static_launch`, `StaticLaunch.launch`) cost more than the launch itself.

It returns None for anything it does not handle, and the caller takes the general path, which
also builds the error message of a failed input check: another device, dtype, size, stride, a
pointer Triton would specialize differently (not 16-byte aligned), torch's deterministic mode
(it may ask to fill outputs), or an active launch hook (a profiler's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.loopir.codegen import LayoutGuard, layout_guard

from .static_launch import ALIGNMENT, StaticLaunch

FastLaunch = Callable[[tuple], "tuple[torch.Tensor, ...] | None"]


def fast_launch(plan: Any, static: StaticLaunch, device: int, knobs: Any, current_stream: Callable[[int], int],
                allocate: Callable[..., torch.Tensor], current_device: Callable[[], int] | None = None,
                stored: tuple[tuple[int, int], ...] = (),
                checked: tuple[torch.Tensor, Callable[[torch.Tensor], None]] | None = None) -> FastLaunch | None:
    """The one-frame launch of `plan` through `static` on CUDA device `device`, or None when
    `static` passes its arguments in another order than (inputs, outputs, sizes).

    `knobs`: Triton's runtime knobs (launch hooks); `allocate(size, stride, dtype)` allocates an
    output on the current device; `current_device()` is its index (torch's, by default);
    `stored`: (output, input) positions of outputs written into an input's memory (the kernel's
    `input_stores`), which are that input, not allocated; `checked`: for a kernel with run-time
    checks, (its `kiln_status` buffer, zeroed, which only a failing check writes; the assert
    that it is still zero, run after each launch without waiting)."""
    status, assert_ok = checked if checked is not None else (None, None)
    n_args = len(plan.in_meta) + len(plan.out_allocations) + len(plan.sizes) + (status is not None)
    if static.kept_prefix != n_args or not plan.in_meta:
        return None
    in_meta, allocations = plan.in_meta, plan.out_allocations
    tail = (*plan.sizes, *((status,) if status is not None else ()), *static.nulls)
    launch_kernel, function = static.impl._launch_kernel, static.function
    grid_x, warps, shared, letters = plan.grid[0], static.num_warps, static.shared, static.letters
    current_device = current_device or torch._C._cuda_getDevice
    deterministic = torch.are_deterministic_algorithms_enabled
    by_output = dict(stored)
    sources = tuple(by_output.get(position) for position in range(len(allocations))) if stored else ()

    guard: LayoutGuard | bool | None = None  # the input check in one C++ call (layout_guard)

    def launch(inputs: tuple) -> tuple[torch.Tensor, ...] | None:
        nonlocal guard
        if current_device() != device or deterministic():
            return None
        enter = knobs.launch_enter_hook
        if enter is not None and getattr(enter, "calls", True):
            return None
        try:
            if guard and guard(*inputs):  # every layout as specialized: the alignment is left
                for tensor in inputs:
                    if tensor.data_ptr() % ALIGNMENT:
                        return None
            else:  # the complete check, which decides; the guard is built from the first inputs it passes
                for tensor, (dtype, size, stride) in zip(inputs, in_meta):
                    if (tensor.dtype is not dtype or tensor.get_device() != device or tensor.stride() != stride
                            or tensor.shape != size or tensor.data_ptr() % ALIGNMENT):
                        return None
                if guard is None and len(inputs) == len(in_meta):
                    guard = layout_guard(inputs) or False
        except (AttributeError, TypeError):  # not a tensor: the general path's check names it
            return None
        if sources:
            outputs = tuple([inputs[source] if source is not None else allocate(size, stride, dtype)
                             for source, (size, stride, dtype) in zip(sources, allocations)])
        else:
            outputs = tuple([allocate(size, stride, dtype) for size, stride, dtype in allocations])
        launch_kernel(function, grid_x, 1, 1, warps, shared, letters, inputs + outputs + tail,
                      current_stream(device))
        if assert_ok is not None:
            assert_ok(status)
        return outputs

    return launch

