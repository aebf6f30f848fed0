"""Calling generated kernels: check inputs, allocate outputs, pick block sizes, launch.

Per-call work is kept small, since a graph of a few kernels on small tensors is dominated by
the host: everything that depends only on the size arguments (output layouts, expected input
layouts, block sizes, grid) is computed once per distinct sizes as a `_Plan`; input checks
compare against it directly and only build an error message on a mismatch. On a GPU, the
first launch of each specialization goes through `JITFunction[grid](...)` (which compiles);
later ones call the compiled kernel's launcher directly (see `launch.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import Kernel, fill_requested, fill_uninitialized
from kiln.loopir.codegen import CheckSite, SizeFunction, raise_failed_check

from . import autotune
from .fast_launch import FastLaunch
from .indexing import INT32_LIMIT
from .launch import DirectLauncher
from .options import TritonCodegenError, TritonOptions, contiguous_rblock_cap, persistent_rows
from .serialize import KernelSignature, rebuild_kernel, stored_kernel
from .tiling import Tile

log = logging.getLogger(__name__)

MAX_PLANS = 64  # distinct size tuples remembered per kernel (dynamic shapes)


def _block(work: int, cap: int) -> int:
    """The next power of two of `work`, at most `cap`."""
    return min(cap, 1 << max(work - 1, 0).bit_length())


def _int_class(value: int) -> tuple[bool, bool, bool]:
    """What Triton specializes an int argument on: == 1, divisible by 16, 32-bit."""
    return value == 1, value % 16 == 0, -(2**31) <= value < 2**31


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """Everything a launch needs that depends only on the size arguments."""

    sizes: tuple[int, ...]
    empty: bool  # no outer point: nothing to launch
    grid: tuple[int]
    blocks: tuple[int, ...]  # XBLOCK (, RBLOCK) (, INDEX_64): the constexpr arguments, in signature order
    launch: dict[str, int]  # the same as keywords for JITFunction[grid](...), plus num_warps
    size_key: tuple  # blocks, warps and the sizes' classes: the plan's part of the launcher key (see DirectLauncher)
    in_meta: tuple[tuple[torch.dtype, tuple[int, ...], tuple[int, ...]], ...]  # per input: dtype, sizes, strides
    out_allocations: tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype], ...]  # empty_strided's arguments
    xnumel: int  # outer points (a scatter's: its program count)
    rnumel: int  # the longest reduction (1 without)
    tile_sizes: tuple[int, ...]  # (ynumel, xnumel) of a tiled pointwise kernel's two tiled dims
    tuned: bool = False  # blocks chosen by timing them (mode="max-autotune"), not by heuristics


# Measured on an H200 (tools/bench_gpu_rows.py, BENCHMARKS.md): 1 KiB of the tile's widest
# input per warp beat 512 B and 2 KiB across softmax, norms, var_mean and sums at rows of 1024
# to 16384, float32 and bfloat16; strided reductions do best with four times the warps.
_TILE_BYTES_PER_WARP = 1024
# A pointwise kernel of 2-byte values takes twice `xblock` (16 values a thread at 4 warps) where
# its compiled form needs at most this many registers a thread, else `xblock` (8 values a
# thread): beyond it fewer programs fit an SM, and its math no longer hides the loads. H200,
# session 22, 2^26 bfloat16 / float16 elements, CUDA graph replays, % of copy at 16 / 8 values
# a thread (registers at 16): gelu 72.6 / 67.6 (32), erf 79.9 / 74.4 (32), sin 91.9 / 81.8 (29),
# exp + log1p 82.9 / 74.0 (40), tanh gelu 83.2 / 80.6 (40), sigmoid * tanh 72.1 / 72.2 (40);
# against: sigmoid(x) * x + tanh(x) / 2 66.7 / 71.6 (56), sigmoid + tanh + exp 58.3 / 61.7 (64),
# sin + cos 35.3 / 49.5 (107). Light kernels (silu, exp, x * 2 + 1) are at copy speed either way.
_WIDE_POINTWISE_MAX_REGISTERS = 48
_LONG_STRIDED_CHUNK = 1024  # rows of a strided reduction's chunk from which 2-byte tiles widen
# A kernel that holds whole rows (`serialize.rereads_rows`: var_mean's two loops, no row
# stored): rows up to `float32_contiguous_rblock` elements in one step whatever their dtype, one
# warp per 2 KiB of the tile, 2 to 8 warps. Measured on an H200 (2^26-element var_mean,
# `tools/sweep_reduction_blocks.py`, BENCHMARKS.md session 13): bfloat16 16384-wide rows +25%
# against RBLOCK 8192 with 16 warps, 4096-wide +10%, float32 4096-wide +4%; softmax and norms
# (which store rows) lost with whole rows held.
_HELD_ROW_BYTES_PER_WARP = 2048
_HELD_ROW_MAX_WARPS = 8
# A kernel with a Welford reduction keeps three float32 running states per lane of its
# XBLOCK x RBLOCK tile whatever its inputs' dtype: its tile is at most
# `TritonOptions.welford_rblock` elements, one warp per this many of them (4 per thread).
_WELFORD_ELEMENTS_PER_WARP = 128

# Allocates on the current CUDA device without torch's dispatcher: about half the host time of
# torch.empty_strided(..., device=...) per output (the allocator Dynamo's own guards use; None
# on a torch without it, which then takes the dispatcher's path).
_EMPTY_STRIDED_CUDA = getattr(getattr(torch._C, "_dynamo", None) and torch._C._dynamo.guards,
                              "_empty_strided_cuda", None)


class TritonKernel:
    """`kernel(*inputs, *symbol_values) -> tuple(outputs)`, launching a generated Triton kernel.

    `kernel` is the loopir `Kernel` it was generated from, or only its `KernelSignature` once
    unpickled (see serialize.py)."""

    def __init__(self, kernel: Kernel | KernelSignature, jit_function: Any, options: TritonOptions,
                 checks: Sequence[CheckSite] = (), index_bounds: Sequence[sympy.Expr] = (),
                 tile: Tile | None = None) -> None:
        self.__name__ = kernel.name
        self.kernel = kernel
        self.checks = tuple(checks)  # run-time checks: the kernel then takes a `kiln_status` buffer
        # Bounds of the kernel's index values in its size symbols: the kernel then takes an
        # INDEX_64 constexpr, set when one reaches INT32_LIMIT (see `kernel_source.LaunchInfo`).
        self.index_bounds = tuple(index_bounds)
        self.tile = tile  # a 2-D tiled pointwise kernel (see `tiling.py`)
        self.jit_function = jit_function
        self.options = options
        signature = KernelSignature.of(kernel)
        self.reduction = signature.reduction
        self.interpreted = type(jit_function).__name__ == "InterpretedFunction"
        self.contiguous = signature.contiguous
        self._holds_rows = signature.holds_rows
        self._welford = signature.welford and signature.contiguous
        rnumels = list(signature.reduction_numels)
        self._n_in = len(kernel.inputs)
        self._n_args = self._n_in + len(kernel.symbols)
        self._in_dtypes = tuple(i.dtype for i in kernel.inputs)
        # The row fits one RBLOCK and the source has no loop over it (`options.persistent_rows`):
        # max-autotune keeps its RBLOCK.
        self.persistent = persistent_rows(options, signature.persistent_numel, self._in_dtypes, self._holds_rows,
                                          signature.welford)
        self._layouts = SizeFunction(kernel.symbols, [o.size for o in kernel.outputs] + [o.stride for o in kernel.outputs]
                                     + [i.size for i in kernel.inputs] + [i.stride for i in kernel.inputs]
                                     + [[signature.numel] + rnumels, self.index_bounds]
                                     + ([[signature.ranges[tile.y], signature.ranges[tile.x]]] if tile else []))
        self._plans: dict[tuple, _Plan] = {}
        self._launcher = None if self.interpreted else DirectLauncher(jit_function, options.check_inputs)
        self._check_inputs = options.check_inputs
        self._scatter_bases = signature.scatter_bases
        self._input_stores = signature.input_stores  # outputs whose storage is an input's (a mutated input)
        # the (output, base) copies made before each call: none where the output is the base's own
        # memory (a scatter into its dead base: `input_stores`)
        stores = {tuple(pair) for pair in self._input_stores}
        self._base_copies = tuple(tuple(pair) for pair in self._scatter_bases if tuple(pair) not in stores)
        self._serial = signature.serial
        # The one-frame launch of a static kernel (fast_launch.py): None until its static
        # launch went through, False where it cannot apply.
        self._fast: FastLaunch | bool | None = None
        # (Run-time checks too, unless they are synchronous: a check's status then lives in one
        # zeroed buffer per kernel, which only a failing check writes, and a device-side assert
        # follows each launch, as on the general path.)
        self._fast_eligible = (self._launcher is not None and not kernel.symbols
                               and not (self.checks and options.sync_checks)
                               and not self._scatter_bases and not options.fill_uninitialized)

    def __reduce__(self) -> tuple[Any, ...]:
        return rebuild_kernel, (type(self), stored_kernel(self))

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        # Runs once per kernel per call of a compiled graph: the common path is plain attribute
        # reads and tuple work (tools/host_overhead.py --breakdown measures it on a GPU).
        if len(args) != self._n_args:
            raise TypeError(f"{self.__name__} takes {self._n_in} tensors and {len(self.kernel.symbols)} "
                            f"sizes, got {len(args)} arguments")
        fast = self._fast
        if fast and len(args) == self._n_in:
            outputs = fast(args)
            if outputs is not None:
                return outputs
        inputs, size_args = args[:self._n_in], self._plan_key(args[self._n_in:])
        plan = self._plans.get(size_args) or self._new_plan(size_args)
        if self._check_inputs and not self._inputs_match(inputs, plan):
            self._check(inputs, plan)
        if self.options.autotune and not plan.tuned:
            plan = self._plans[size_args] = self._tuned(plan, inputs)
        index = None  # the CUDA device the launch goes to, when known here (the launcher asks otherwise)
        if inputs and inputs[0].is_cuda and _EMPTY_STRIDED_CUDA is not None:
            index = inputs[0].get_device()
            if index != torch._C._cuda_getDevice():  # launches go to the current device: make it theirs
                with torch.cuda.device(index):
                    return self(*args)
            outputs = [_EMPTY_STRIDED_CUDA(size, stride, dtype) for size, stride, dtype in self._allocated(plan)]
            device = None  # the current CUDA device
        else:
            device = inputs[0].device if inputs else self._default_device
            outputs = [torch.empty_strided(size, stride, dtype=dtype, device=device)
                       for size, stride, dtype in self._allocated(plan)]
        if fill_requested(self.options.fill_uninitialized):
            fill_uninitialized(outputs)
        if self._input_stores:  # the kernel writes these outputs into their inputs' memory (not filled)
            for out_pos, in_pos in sorted(self._input_stores):
                outputs.insert(out_pos, inputs[in_pos])
        outputs = tuple(outputs)
        for out_pos, in_pos in self._base_copies:  # a scatter's buffer starts as a copy of its base
            outputs[out_pos].copy_(inputs[in_pos])
        if plan.empty:
            return outputs
        status = ()
        if self.checks:
            status = (torch.zeros(1, dtype=torch.int32, device=inputs[0].device if device is None else device),)
        self.launch_plan(plan, inputs, outputs, status, index)
        if status:
            self._report_checks(status[0], plan)
        if fast is None and index is not None:  # None: not yet known; False: never
            self._fast = self._fast_eligible and self._fast_launch(plan, index)
        return outputs

    def _fast_launch(self, plan: _Plan, index: int) -> FastLaunch | bool | None:
        """The launcher's one-frame launch of `plan` on CUDA device `index` (fast_launch.py)."""
        checked = None
        if self.checks:  # the one status buffer of the fast path, and the assert after each launch
            checked = (torch.zeros(1, dtype=torch.int32, device=f"cuda:{index}"), self._assert_checks)
        return self._launcher.fast_launch(plan, index, _EMPTY_STRIDED_CUDA, self._input_stores, checked)

    def _allocated(self, plan: _Plan) -> tuple[tuple[Any, Any, torch.dtype], ...]:
        """The (size, stride, dtype) of each output the call allocates: all but those the kernel
        stores into an input's memory (`input_stores`)."""
        if not self._input_stores:
            return plan.out_allocations
        stored = {out_pos for out_pos, _ in self._input_stores}
        return tuple(a for position, a in enumerate(plan.out_allocations) if position not in stored)

    def can_precompile(self) -> bool:
        """Whether `warmup_arguments` knows this kernel's launch before any call: a GPU kernel
        whose sizes are all known and whose blocks are not timed at the first launch."""
        if self._launcher is None or self.kernel.symbols or self.options.autotune:
            return False
        size_args = self._plan_key(())
        # (the heuristic's plan, not `_new_plan`: that may compile, which precompile's threads do)
        return not (self._plans.get(size_args) or self._heuristic_plan(size_args)).empty

    def warmup_arguments(self) -> tuple[tuple[Any, ...], tuple[int], dict[str, int]]:
        """(arguments, grid, keywords) for `JITFunction.warmup`: its launch with tensors given
        by their dtypes (see precompile.py)."""
        return self._warmup_arguments(self._first_plan())

    def _warmup_arguments(self, plan: _Plan) -> tuple[tuple[Any, ...], tuple[int], dict[str, int]]:
        status = (torch.int32,) if self.checks else ()
        outputs = tuple(dtype for _, _, dtype in plan.out_allocations)
        return (*self._in_dtypes, *outputs, *plan.sizes, *status), plan.grid, plan.launch

    def _registers(self, plan: _Plan) -> int | None:
        """Registers a thread of `plan`'s compiled kernel uses (it compiles here, into the
        JITFunction's cache, where its launch finds it); None under the interpreter or where this
        Triton does not say."""
        if self._launcher is None:
            return None
        args, grid, launch = self._warmup_arguments(plan)
        try:
            compiled = self.jit_function.warmup(*args, grid=grid, **launch)
            compiled._init_handles()  # loads the binary: Triton reads its register count then
            return int(compiled.n_regs)
        except Exception as error:  # noqa: BLE001 - the heuristic's plan stands; its launch reports errors
            log.debug("codegen_triton: no register count for %s (%s)", self.__name__, error)
            return None

    def _first_plan(self) -> _Plan:
        """The plan of a kernel without size symbols (its only one)."""
        size_args = self._plan_key(())
        return self._plans.get(size_args) or self._new_plan(size_args)

    def _plan_key(self, size_args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The sizes a plan is kept under; a scatter adds whether it runs serially (deterministic
        algorithms asked for)."""
        if self._scatter_bases:
            return (*size_args, self._serial or torch.are_deterministic_algorithms_enabled())
        return size_args

    def launch_plan(self, plan: _Plan, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                    status: Sequence[torch.Tensor] = (), device: int | None = None) -> None:
        """Launch the kernel as `plan` says, into `outputs` (allocated by the caller), on CUDA
        device `device` when the caller knows it is the current one."""
        if self._launcher is None:
            self.jit_function[plan.grid](*inputs, *outputs, *plan.sizes, *status, **plan.launch)
        else:
            self._launcher.launch(plan, inputs, outputs, status, device)

    def _tuned(self, plan: _Plan, inputs: Sequence[torch.Tensor]) -> _Plan:
        """`plan` with timed block sizes (see autotune.py); the heuristic's under the interpreter,
        which has no GPU time to measure."""
        if self.interpreted and autotune.measure_override is None:
            return dataclasses.replace(plan, tuned=True)
        return autotune.tune(self, plan, inputs, autotune.measure_override)

    def _report_checks(self, status: torch.Tensor, plan: _Plan) -> None:
        """Raise the failed check's exception (waiting for the kernel), or on a GPU without
        `sync_checks` turn a nonzero status into a device-side assert (nothing waits)."""
        if self.interpreted or self.options.sync_checks:
            number = int(status.item())  # .item() waits for the kernel
            if number:
                raise_failed_check(self.__name__, self.kernel.symbols, self.checks, number, plan.sizes)
            return
        self._assert_checks(status)

    def _assert_checks(self, status: torch.Tensor) -> None:
        """A device-side assert that `status` is still 0 (no check failed); nothing waits."""
        torch._assert_async(status == 0, self._async_message)

    @functools.cached_property
    def _async_message(self) -> str:
        """At most 254 characters: torch._assert_async's limit on CUDA."""
        checks = "; ".join(dict.fromkeys(f"{c.error.__name__}: {c.message.format(size='its size')}"
                                         for c in self.checks))
        head = f"kiln: a run-time check of Triton kernel {self.__name__} failed ("
        tail = "); rerun with sync_checks=True (KILN_SYNC_CHECKS=1) for eager's exception"
        room = 254 - len(head) - len(tail)
        return head + (checks if len(checks) <= room else checks[:room - 3] + "...") + tail

    def _new_plan(self, size_args: tuple) -> _Plan:
        """The plan for these sizes, kept: the heuristic's, a heavy 2-byte pointwise kernel
        narrowed (`_narrowed_if_heavy`: it compiles the wide form to count its registers)."""
        plan = self._heuristic_plan(size_args)
        if (plan.launch.get("XBLOCK", 0) > self.options.xblock
                and not (self.reduction or self.tile or self._scatter_bases)):
            plan = self._narrowed_if_heavy(plan)
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        self._plans[size_args] = plan
        return plan

    def _heuristic_plan(self, size_args: tuple) -> _Plan:
        serial = bool(size_args[-1]) if self._scatter_bases else False
        sizes = tuple(int(s) for s in size_args[:len(self.kernel.symbols)])
        rows = self._layouts(*sizes)
        n_out, n_in = len(self.kernel.outputs), self._n_in
        in_rows = rows[2 * n_out:]
        (xnumel, *rnumels), bounds = rows[2 * (n_out + n_in)], rows[2 * (n_out + n_in) + 1]
        blocks = {}
        if self._scatter_bases:  # one program per chunk of the source, or one walking all of it
            rnumel = max(rnumels, default=0)
            blocks["RBLOCK"], blocks["SERIAL"] = (1 if serial else _block(rnumel, self.options.xblock)), serial
            xnumel = 0 if rnumel == 0 else (1 if serial else -(-rnumel // blocks["RBLOCK"]))
        elif self.reduction:
            blocks["XBLOCK"], blocks["RBLOCK"] = self._reduction_blocks(xnumel, max(rnumels, default=1))
        elif self.tile:
            ynumel, tile_xnumel = rows[-1]
            blocks["XBLOCK"], blocks["YBLOCK"] = (_block(tile_xnumel, self.options.tile_block),
                                                  _block(ynumel, self.options.tile_block))
        else:
            blocks["XBLOCK"] = _block(xnumel, self._pointwise_xblock)
        if self.index_bounds:
            blocks["INDEX_64"] = max(bounds) >= INT32_LIMIT
        tile_sizes = tuple(rows[-1]) if self.tile else ()
        return self.with_blocks(_Plan(
            sizes, xnumel == 0, (0,), (), {}, (),
            tuple(zip(self._in_dtypes, in_rows[:n_in], in_rows[n_in:2 * n_in])),
            tuple((tuple(size), tuple(stride), out.dtype)
                  for size, stride, out in zip(rows[:n_out], rows[n_out:2 * n_out], self.kernel.outputs)),
            xnumel, max(rnumels, default=1), tile_sizes), blocks, self._warps(blocks))

    def _narrowed_if_heavy(self, plan: _Plan) -> _Plan:
        """A 2-byte pointwise plan at twice `xblock`, or at `xblock` where that kernel needs more
        than `_WIDE_POINTWISE_MAX_REGISTERS` registers a thread (its math then bounds it)."""
        registers = self._registers(plan)
        if registers is None or registers <= _WIDE_POINTWISE_MAX_REGISTERS:
            return plan
        blocks = {name: value for name, value in plan.launch.items() if name != "num_warps"}
        narrow = {**blocks, "XBLOCK": _block(plan.xnumel, self.options.xblock)}
        log.debug("codegen_triton: %s uses %d registers a thread at XBLOCK %d: XBLOCK %d", self.__name__,
                  registers, blocks["XBLOCK"], narrow["XBLOCK"])
        return self.with_blocks(plan, narrow, self._warps(narrow))

    def with_blocks(self, plan: _Plan, blocks: dict[str, int], num_warps: int, tuned: bool = False) -> _Plan:
        """`plan` launched with these constexpr blocks (in signature order) and warps."""
        return dataclasses.replace(
            plan, grid=(self._programs(plan.xnumel, plan.tile_sizes, blocks),), blocks=tuple(blocks.values()),
            launch={"num_warps": num_warps, **blocks}, tuned=tuned,
            size_key=(tuple(blocks.values()), num_warps, tuple(_int_class(s) for s in plan.sizes)))

    def _programs(self, xnumel: int, tile_sizes: Sequence[int], blocks: dict[str, int]) -> int:
        """How many programs cover the outer points: XBLOCK each, or one per tile."""
        if not tile_sizes:  # a scatter's xnumel is already its program count (no XBLOCK)
            return -(-xnumel // blocks.get("XBLOCK", 1))
        ynumel, tile_xnumel = tile_sizes
        others = xnumel // (ynumel * tile_xnumel) if xnumel else 0
        return -(-tile_xnumel // blocks["XBLOCK"]) * -(-ynumel // blocks["YBLOCK"]) * others

    def _warps(self, blocks: dict[str, int]) -> int:
        """Pointwise and scatter kernels: `num_warps`; reductions and tiles: one warp per KiB of
        the tile's widest input (2 to `max_reduction_warps`), so a long row is read by enough
        threads to keep loads wide."""
        if not (self.reduction or self.tile) or self._scatter_bases:
            return self.options.num_warps
        tile = blocks["XBLOCK"] * blocks.get("RBLOCK", blocks.get("YBLOCK"))
        if self._welford:
            return max(2, min(self.options.max_reduction_warps, tile // _WELFORD_ELEMENTS_PER_WARP))
        tile_bytes = tile * self._widest_input
        if self._holds_rows:
            return max(2, min(_HELD_ROW_MAX_WARPS, self.options.max_reduction_warps,
                              tile_bytes // _HELD_ROW_BYTES_PER_WARP))
        # A strided reduction's loads are short runs along XBLOCK: it needs more warps in flight
        # (8 bytes per thread: see `TritonOptions.strided_tile`).
        per_warp = _TILE_BYTES_PER_WARP if self.contiguous or self.tile else _TILE_BYTES_PER_WARP // 4
        return max(2, min(self.options.max_reduction_warps, tile_bytes // per_warp))

    @functools.cached_property
    def _input_sizes(self) -> tuple[int, ...]:
        return tuple(torch.empty((), dtype=d).element_size() for d in self._in_dtypes)

    @functools.cached_property
    def _pointwise_xblock(self) -> int:
        """`options.xblock`, doubled when every input and output is 2 bytes wide: each thread
        then moves 32 bytes per access, as with float32 (H200, 2^27 bfloat16 elements, CUDA graph
        replays: gelu 64.7 -> 70.0% of copy, tanh gelu 78.0 -> 81.1, x * 2 + 1 and silu within 0.7
        points; float32 best at 1024)."""
        widths = {d.itemsize for d in (*self._in_dtypes, *(o.dtype for o in self.kernel.outputs))}
        return self.options.xblock * 2 if widths == {2} else self.options.xblock

    @functools.cached_property
    def _widest_input(self) -> int:
        return max(self._input_sizes, default=4)

    def _reduction_blocks(self, xnumel: int, rnumel: int) -> tuple[int, int]:
        """(XBLOCK, RBLOCK); see `TritonOptions.rblock`, `contiguous_rblock` and `welford_rblock`."""
        options = self.options
        if self._welford:  # a tile of at most `welford_rblock` elements (see _WELFORD_ELEMENTS_PER_WARP)
            rblock = _block(rnumel, options.welford_rblock)
            return _block(xnumel, min(options.reduction_xblock, max(1, options.welford_rblock // rblock))), rblock
        if not self.contiguous:
            # Long chunks of 2-byte values: twice the columns and the tile, so each row segment
            # is a 128-byte line (H200, session 21: bfloat16 sums over dim 0 in 2048-row chunks
            # 49.9 -> 44.8 us; chunks of 512 rows or fewer were as fast or faster at 32 x 16).
            wide = 2 if self._widest_input == 2 and rnumel >= _LONG_STRIDED_CHUNK else 1
            xblock = _block(xnumel, options.strided_xblock * wide)
            return xblock, _block(rnumel, min(options.rblock, max(1, options.strided_tile * wide // xblock)))
        rblock = _block(rnumel, contiguous_rblock_cap(options, self._in_dtypes, self._holds_rows))
        budget = options.reduction_xblock * options.rblock
        return _block(xnumel, min(options.reduction_xblock, max(1, budget // rblock))), rblock

    @staticmethod
    def _inputs_match(inputs: Sequence[Any], plan: _Plan) -> bool:
        """The cheap check: exact dtypes, strides, sizes and one device (no message built)."""
        try:
            device = inputs[0].get_device() if len(inputs) > 1 else None
            for tensor, (dtype, size, stride) in zip(inputs, plan.in_meta):
                if tensor.dtype is not dtype or tensor.stride() != stride or tensor.shape != size:
                    return False
                if device is not None and tensor.get_device() != device:
                    return False
        except (AttributeError, TypeError):  # not a tensor: the full check names it
            return False
        return True

    @functools.cached_property
    def _default_device(self) -> torch.device:
        """Where a kernel without tensor inputs allocates: loopir's specs carry no device yet
        (asked once: `torch.cuda.is_available` reads the environment on every call)."""
        if self.options.device is not None:
            return torch.device(self.options.device)
        return torch.device("cuda" if torch.cuda.is_available() and not self.interpreted else "cpu")

    def _check(self, inputs: Sequence[torch.Tensor], plan: _Plan) -> None:
        """The full check, with a message naming the input; strides of size-1 dims are free."""
        device = next((t.device for t in inputs if isinstance(t, torch.Tensor)), None)
        for tensor, (_, size, stride), spec in zip(inputs, plan.in_meta, self.kernel.inputs):
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != spec.dtype or tensor.device != device:
                got = f"{tensor.dtype} on {tensor.device}" if isinstance(tensor, torch.Tensor) else type(tensor)
                raise TritonCodegenError(f"{self.__name__}: input {spec.name} must be a {spec.dtype} tensor "
                                         f"on {device}, got {got}")
            if tuple(tensor.shape) != size:
                raise TritonCodegenError(f"{self.__name__}: input {spec.name} has sizes {tuple(tensor.shape)}, "
                                         f"but the size arguments {list(plan.sizes)} give {size}")
            if any(st != e for st, e, n in zip(tensor.stride(), stride, tensor.shape) if n > 1):
                raise TritonCodegenError(f"{self.__name__}: input {spec.name} has strides {tensor.stride()}, "
                                         f"but the kernel was generated for {stride}")

    def __repr__(self) -> str:
        return f"<Triton kernel {self.__name__}>"
