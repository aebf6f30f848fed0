"""`DirectLauncher`: launch compiled Triton kernels without re-running Triton's dispatch.

`JITFunction[grid](*args)` binds the arguments, computes their specialization (dtypes,
16-byte alignment of pointers, ints equal to 1 / divisible by 16 / 32-bit), looks the compiled
kernel up, then calls its launcher: tens of microseconds of Python per launch, more than many
small kernels take to run. The first launch of each specialization still goes through it (it
compiles, and returns the `CompiledKernel`); the launcher is remembered under a key at least
as fine as Triton's specialization (see `_key`), and later launches with that key call
``compiled.run(grid, stream, function, metadata, hooks, *args)`` directly, exactly as
`JITFunction.run` does (triton >= 3.4: all arguments, constexprs included, are passed; the
launcher skips the constexprs). Triton versions without those pieces keep the plain path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from .fast_launch import FastLaunch, fast_launch
from .static_launch import ALIGNMENT, StaticLaunch

log = logging.getLogger(__name__)


def _runtime() -> tuple[Any, Any, Any] | None:
    """(knobs.runtime, get_current_device, get_current_stream) of the active Triton driver,
    or None when this Triton is too old for direct launches."""
    try:
        from triton import knobs
        from triton.runtime import driver
    except ImportError:
        return None
    active = driver.active
    if not hasattr(knobs, "runtime") or not hasattr(active, "get_current_stream"):
        return None
    return knobs.runtime, active.get_current_device, active.get_current_stream


class DirectLauncher:
    """Launches one `JITFunction` for `TritonKernel`; see the module docstring."""

    def __init__(self, jit_function: Any, dtypes_checked: bool) -> None:
        self.jit_function = jit_function
        self.dtypes_checked = dtypes_checked  # TritonKernel checked input dtypes; else they join the key
        self._launchers: dict[tuple, tuple[Any, Any, Any, Any]] = {}
        self._runtime: tuple[Any, Any, Any] | None = None
        self._direct = True  # False once this Triton turned out not to support direct launches
        self._proven = False  # a direct launch went through (argument errors surface on the first)

    def launch(self, plan: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
               status: Sequence[torch.Tensor] = (), device: int | None = None) -> None:
        """`status`: the kernel's `kiln_status` buffer, for kernels with run-time checks;
        `device`: the current CUDA device when the caller has it already (else asked here).

        This runs once per kernel per call of a compiled graph: every step is kept to plain
        attribute reads and tuple work (tools/host_overhead.py --breakdown measures it)."""
        runtime = self._runtime
        if runtime is None and self._direct:
            runtime = self._runtime = _runtime()
            self._direct = runtime is not None
        if not self._direct:
            self.jit_function[plan.grid](*inputs, *outputs, *plan.sizes, *status, **plan.launch)
            return
        knobs, current_device, current_stream = runtime
        if device is None:
            device = current_device()
        # The key: at least as fine as Triton's specialization. Device, block sizes, the size
        # ints' classes (plan.size_key) and which input pointers are not 16-byte aligned
        # (outputs are fresh allocations of torch's caching allocator: always aligned).
        misaligned, bit = 0, 1
        for tensor in inputs:
            if tensor.data_ptr() % ALIGNMENT:
                misaligned |= bit
            bit <<= 1
        key = (device, plan.size_key, misaligned)
        if not self.dtypes_checked:  # TritonKernel did not check input dtypes: they join the key
            key += tuple(t.dtype for t in inputs)
        found = self._launchers.get(key)
        if found is None:
            self._first_launch(key, plan, inputs, outputs, status)
            return
        run, function, metadata, compiled, static = found
        stream = current_stream(device)
        enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
        args = (*inputs, *outputs, *plan.sizes, *status, *plan.blocks)
        # A hook (e.g. a profiler's) gets the launch's metadata; an empty HookChain is inactive.
        hooked = enter is not None and getattr(enter, "calls", True)
        if static is not None and not hooked:
            if self._static_launch(key, static, plan, stream, args):
                return
        launch_metadata = compiled.launch_metadata(plan.grid, stream, *args) if hooked else None
        if self._proven:
            run(plan.grid[0], 1, 1, stream, function, metadata, launch_metadata, enter, leave, *args)
            return
        try:  # the launcher parses every argument before it launches: a failure launched nothing
            run(plan.grid[0], 1, 1, stream, function, metadata, launch_metadata, enter, leave, *args)
        except (TypeError, ValueError) as error:
            log.warning("codegen_triton: direct launch of %s failed (%s); launching through "
                        "JITFunction[grid](...) from now on", getattr(self.jit_function, "__name__", "?"), error)
            self._direct = False
            self.jit_function[plan.grid](*inputs, *outputs, *plan.sizes, *status, **plan.launch)
            return
        self._proven = True

    def fast_launch(self, plan: Any, device: int, allocate: Any, stored: tuple[tuple[int, int], ...] = (),
                    checked: tuple[torch.Tensor, Any] | None = None) -> FastLaunch | bool | None:
        """The one-frame launch of `plan` on `device` with 16-byte aligned inputs (fast_launch.py),
        once its static launch went through; None while it has not yet, False if it never can.
        `allocate(size, stride, dtype)`: allocates an output on the current CUDA device;
        `stored`: the kernel's (output, input) stores into inputs; `checked`: a kernel with
        run-time checks: (its zeroed status buffer, the assert run on it after each launch)."""
        entry = self._launchers.get((device, plan.size_key, 0))
        if not self._direct or not self.dtypes_checked:
            return False
        if entry is None or (entry[4] is not None and not entry[4].proven):
            return None
        if entry[4] is None:
            return False
        knobs, _, current_stream = self._runtime
        return fast_launch(plan, entry[4], device, knobs, current_stream, allocate, stored=stored,
                           checked=checked) or False

    @property
    def direct(self) -> bool:
        """Whether launches after the first of a specialization skip `JITFunction[grid](...)`."""
        return self._direct and self._proven

    def _first_launch(self, key: tuple, plan: Any, inputs: Sequence[torch.Tensor],
                      outputs: Sequence[torch.Tensor], status: Sequence[torch.Tensor]) -> None:
        compiled = self.jit_function[plan.grid](*inputs, *outputs, *plan.sizes, *status, **plan.launch)
        try:
            run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
        except AttributeError:
            log.info("codegen_triton: this Triton's compiled kernels have no direct launcher; "
                     "every launch goes through JITFunction[grid](...)")
            self._direct = False
            return
        self._launchers[key] = (run, function, metadata, compiled, StaticLaunch.of(compiled, key[0]))

    def _static_launch(self, key: tuple, static: StaticLaunch, plan: Any, stream: int, args: tuple) -> bool:
        """Launch through torch's C++ launcher; False (and Triton's launcher from now on for
        this key) when its first launch refuses the arguments."""
        if static.proven:
            static.launch(plan.grid[0], stream, args)
            return True
        try:
            static.launch(plan.grid[0], stream, args)
        except (TypeError, ValueError, RuntimeError) as error:
            log.warning("codegen_triton: static launch of %s failed (%s); using Triton's launcher",
                        getattr(self.jit_function, "__name__", "?"), error)
            self._launchers[key] = (*self._launchers[key][:4], None)
            return False
        static.proven = self._proven = True
        return True
