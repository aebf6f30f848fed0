"""`TritonOptions`: every knob of the Triton codegen, one frozen validated dataclass."""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os
import pathlib
from collections.abc import Sequence

import torch

from kiln.loopir.codegen import check_option_types, default_cache_root

log = logging.getLogger(__name__)


def default_cache_dir() -> pathlib.Path:
    """Per user: ``$XDG_CACHE_HOME/kiln/codegen_triton`` or ``~/.cache/kiln/codegen_triton`` (loopir's
    `default_cache_root`), never a fixed path in the shared temp directory."""
    return default_cache_root() / "codegen_triton"


def _is_power_of_two(n: int) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


@dataclasses.dataclass(frozen=True, slots=True)
class TritonOptions:
    """Options of `compile` and `generate`.

    cache_dir: where generated sources are written, one file per content hash.
    xblock: most outer points one program of a pointwise kernel computes; twice as many when
        all its inputs and outputs are 2 bytes wide (bfloat16, float16: the same bytes per thread).
    reduction_xblock: most outer points one program of a reduction kernel computes.
    rblock: most reduction elements a reduction loop step reads per outer point, when the
        reduction walks memory with a stride (sum over a middle dim): a wide XBLOCK then keeps
        neighbouring outer points' reads together.
    strided_xblock: most outer points one program of a strided reduction computes (a sum over
        dim 0: outer points are the contiguous columns, so a wide block reads whole runs of
        them); its RBLOCK is then at most `rblock` and `strided_tile // XBLOCK`.
    strided_tile: most XBLOCK x RBLOCK elements one loop step of a strided reduction reads.
        64 x 8 with a warp per 256 bytes (8 bytes per thread), against 32 x 64 with a warp per
        512 bytes, measured on an H100 (sums over dim 0 of 2^26 elements at 512 to 16384
        columns, loopir's split counts, CUDA graph replays, `tools/strided_tile_probe.py`,
        BENCHMARKS.md session 17): bfloat16 67-76 -> 75-80% of copy, float32 85-87 -> 87-89%.
        32 x 16 since session 21: a layer norm's weight and bias gradients' partial sums (4096 x
        768 float32 in 32 chunks of 128 rows, H200, `tools/strided_reduction_probe.py`) 33.1 ->
        22.1 us (Inductor 23.2), over 16384 x 768: 106 -> 69 us; it is the 16 rows a step that
        count (32 x 8: 33.1 us). Float32 sums over dim 0 of 2^26 elements lost up to 3% (76.6 ->
        79.1 us). Kernels reading 2-byte values in chunks of 1024 rows or more take twice the
        columns and the tile (64 x 16: a 128-byte line a row).
        Tiles holding 16 bytes per thread lost in bfloat16 (64 x 16 with 4 warps: 57-60%).
    contiguous_rblock: the same when every loop over reduction ranges reads them contiguously
        (softmax, layer norm, sum over the last dim): RBLOCK grows up to this, and XBLOCK
        shrinks so that XBLOCK * RBLOCK stays within reduction_xblock * rblock. Rows up to
        this long are read in one step, which makes the later loops over the same row hit L1.
        8192 against 4096, measured on an H200 at 16384-wide bfloat16 rows (CUDA graph replays,
        `tools/bench_gpu_rows.py --graphs`): rmsnorm 75 -> 86% of copy bandwidth, layer norm
        81 -> 85%, softmax 67 -> 70%, var_mean 62 -> 65%, sum 73 -> 75%; 4096-wide rows equal.
        max-autotune's timings had picked 8192 for most of those kernels too.
    float32_contiguous_rblock: `contiguous_rblock` for kernels whose inputs are all 4 bytes
        wide or wider. Measured on an H200 at 16384-wide float32 rows, 16384 against 4096:
        softmax 80 -> 93% of copy bandwidth, rmsnorm 84 -> 94%, var_mean 77 -> 88%, layer norm
        85 -> 84%; the same for bfloat16 rows lost (layer norm 82 -> 57%).
    welford_rblock: most XBLOCK x RBLOCK elements one loop step of a kernel with a `Welford`
        reduction (one-pass variance, read contiguously) reads: each lane keeps three float32
        running states, which spill in whole-row tiles (BENCHMARKS.md session 17); one warp per
        128 elements of the tile, at most `max_reduction_warps`.
    num_warps: warps per pointwise program (ignored by the Triton interpreter).
    max_reduction_warps: reduction (and tiled) programs get one warp per KiB of their
        XBLOCK x RBLOCK (x YBLOCK) tile's widest input (strided reductions: per 256 bytes), at
        least 2 and at most this.
    tile_block: most points along each dim of a 2-D tiled pointwise program (a kernel that
        loads along one dim and stores along another, as a transpose does: see `tiling.py`).
    check_inputs: check input dtypes, devices and strides against the kernel on every call.
    device: where outputs of kernels without tensor inputs are allocated; None means "cuda"
        when torch sees a GPU, else "cpu" (kernels with inputs use their first input's device).
    fill_uninitialized: fill every output with NaN (integers: their largest value) before the
        kernel writes it, so an element a kernel fails to write shows (a debug mode; also on
        under torch's deterministic mode with `fill_uninitialized_memory`, as for torch.empty).
    sync_checks: how a kernel's failed run-time check (an index out of range) reaches Python.
        True: the launch waits for the kernel and raises eager's exception (IndexError, ...)
        naming the kernel, buffer and size. False (default): on a GPU nothing waits; a failed
        check becomes a device-side assert, as eager's own CUDA indexing errors do, reported at
        the next synchronization (the message lists the kernel's checks; rerun with
        `sync_checks=True` for the exact one; kiln's backend sets it under KILN_SYNC_CHECKS=1
        or CUDA_LAUNCH_BLOCKING=1). Waiting after every
        checked kernel stalls the host: on an H200, 53 of an AMP BERT-base training step's
        57.5 ms were the host enqueueing work. Under Triton's interpreter checks are always
        synchronous (they cost nothing).

    compile_threads: right after codegen, kernels whose sizes are all known (static shapes)
        are compiled for the current CUDA device by this many threads, so a graph's first call
        does not compile its kernels one after another (Triton's compiler releases the GIL in
        LLVM and ptxas). 0 or 1: each kernel compiles at its first launch. Kernels with size
        symbols, under the interpreter or with `autotune`, compile at their first launch.
        Default: $KILN_COMPILE_THREADS, else 8.

    autotune: time a few block-size and warp configurations around the heuristics' on each
        kernel's first launch at each set of sizes and keep the fastest (the backend's
        mode="max-autotune"; see autotune.py). Choices are cached under `cache_dir`.

    Block sizes are upper bounds: each launch uses the next power of two of the work it has,
    capped by these.
    """

    cache_dir: pathlib.Path = dataclasses.field(default_factory=default_cache_dir)
    xblock: int = 1024
    reduction_xblock: int = 8
    rblock: int = 128
    strided_xblock: int = 32
    strided_tile: int = 512
    contiguous_rblock: int = 8192
    float32_contiguous_rblock: int = 16384
    welford_rblock: int = 2048
    num_warps: int = 4
    max_reduction_warps: int = 16
    tile_block: int = 64
    check_inputs: bool = True
    device: str | None = None
    fill_uninitialized: bool = False
    sync_checks: bool = False
    autotune: bool = False
    compile_threads: int = dataclasses.field(default_factory=lambda: _threads_from_environment())

    def __post_init__(self) -> None:
        """Every field checked when the options are built: a wrong type raises TypeError, a wrong
        value ValueError, each naming the option and what it accepts."""
        check_option_types(self, _TYPES)
        for name in _BLOCKS:
            value = int(getattr(self, name))
            object.__setattr__(self, name, value)
            if not _is_power_of_two(value):
                raise ValueError(f"TritonOptions.{name} must be a positive power of two, got {value!r}")
        for name in ("num_warps", "max_reduction_warps"):
            if getattr(self, name) > 32:
                raise ValueError(f"TritonOptions.{name} must be a power of two from 1 to 32, got {getattr(self, name)}")
        if self.compile_threads < 0:
            raise ValueError(f"TritonOptions.compile_threads must be an int >= 0, got {self.compile_threads!r}")
        if self.device is not None and not _is_device(self.device):
            raise ValueError(f"TritonOptions.device must be None or a torch device name ('cuda', 'cuda:1', 'cpu'), "
                             f"got {self.device!r}")


def _threads_from_environment() -> int:
    value = os.environ.get("KILN_COMPILE_THREADS", "8")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"KILN_COMPILE_THREADS must be an int >= 0, got {value!r}") from None


def _is_device(name: str) -> bool:
    try:
        torch.device(name)
    except (RuntimeError, ValueError):
        return False
    return True


# Block sizes and warp counts: positive powers of two (Triton's block shapes must be).
_BLOCKS = ("xblock", "reduction_xblock", "rblock", "strided_xblock", "strided_tile", "contiguous_rblock",
           "float32_contiguous_rblock", "welford_rblock", "num_warps", "max_reduction_warps", "tile_block")
_POWER_OF_TWO = ((numbers.Integral,), "a positive power of two (an int)")
# option -> (accepted types, what the error says it accepts); bool is refused where int is
# wanted (True is an int to isinstance).
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "cache_dir": ((str, os.PathLike), "a path (str or os.PathLike)"),
    **{name: _POWER_OF_TWO for name in _BLOCKS},
    "check_inputs": ((bool,), "a bool"),
    "device": ((str, type(None)), "None or a torch device name (a str such as 'cuda')"),
    "fill_uninitialized": ((bool,), "a bool"),
    "sync_checks": ((bool,), "a bool"),
    "autotune": ((bool,), "a bool"),
    "compile_threads": ((numbers.Integral,), "an int >= 0"),
}


class TritonCodegenError(RuntimeError):
    """A kernel graph the Triton codegen cannot translate, or a kernel called with wrong inputs.

    The message names the kernel and the loopir buffer (or input) involved.
    """


def contiguous_rblock_cap(options: TritonOptions, input_dtypes: Sequence[torch.dtype], holds_rows: bool) -> int:
    """The most RBLOCK a reduction kernel reading rows contiguously takes: `float32_contiguous_rblock`
    when every input is 4 bytes wide or wider, or when it holds whole rows (see runtime.py's
    `_HELD_ROW_BYTES_PER_WARP`), else `contiguous_rblock`."""
    wide = min((d.itemsize for d in input_dtypes), default=4) >= 4 or holds_rows
    return options.float32_contiguous_rblock if wide else options.contiguous_rblock


def persistent_rows(options: TritonOptions, numel: int | None, input_dtypes: Sequence[torch.dtype],
                    holds_rows: bool, welford: bool) -> bool:
    """Whether a contiguous reduction kernel whose loops all span `numel` elements (None: not
    one static length; see `kernel_source.persistent_numel`) is persistent: it holds whole rows
    (`holds_rows`: two or more passes over each row, nothing row-shaped stored, as a variance's
    or a logsumexp's) and its row fits one RBLOCK, so its passes run once each and are emitted
    as straight-line code (the same launch as a looped kernel's) where later passes reuse the
    values the first loaded instead of loading them again.

    Measured on an H200 (`tools/bench_gpu_rows.py --graphs`, BENCHMARKS.md session 18): bfloat16
    var_mean 73.5 -> 84.6% of copy at 4096-wide rows, 73.6 -> 84.2% at 16384 (0.91 -> 1.04x
    Inductor), float32 +1-2 points. Kernels that store rows (softmax, norms) gained nothing in
    that form (equal within a point once their one load carried no `evict_first`, which cost
    them 1-6 points), so they loop.
    Welford kernels keep their loop (their blocks are `welford_rblock`)."""
    return (holds_rows and numel is not None and not welford
            and numel <= contiguous_rblock_cap(options, input_dtypes, holds_rows))
