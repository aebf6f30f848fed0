"""Block sizes chosen by timing them: `TritonOptions.autotune` (the backend's mode="max-autotune").

Without it, each launch takes its block sizes and warps from heuristics (`runtime.py`). With it,
the first launch of each kernel at each set of sizes times a few configurations around the
heuristic's on the real inputs and keeps the fastest:
- pointwise kernels: XBLOCK from a quarter to twice the heuristic's, 4 or 8 warps;
- 2-D tiled kernels: square and oblong tiles of 32 to 128 points, 4 or 8 warps;
- reductions: RBLOCK from half to twice the heuristic's, XBLOCK the same or twice, and the
  heuristic's warps or twice as many.
Scatters (whose programs' count is their work split) and kernels with run-time checks (whose
status buffer a failed candidate would set) keep the heuristic. Each candidate is a separate
Triton compile, so tuning costs seconds per kernel; choices are kept on disk under the cache
directory (keyed by the kernel's source, sizes, GPU and Triton version) so a later process
reuses them without timing again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

MAX_CANDIDATES = 10
# Tests replace the GPU timer to tune under Triton's interpreter: (launch, candidate plan) ->
# milliseconds of one launch.
measure_override: Callable[[Callable[[], None], Any], float] | None = None
_MAX_TILE = 65536  # elements of an XBLOCK x RBLOCK tile: beyond this, registers spill


def _pow2_range(low: int, high: int) -> list[int]:
    values, value = [], 1
    while value <= high:
        if value >= low:
            values.append(value)
        value *= 2
    return values


def candidates(kernel: Any, plan: Any) -> list[tuple[dict[str, int], int]]:
    """(blocks, num_warps) to time for `plan`, the heuristic's own first; [] when not tunable."""
    blocks = dict(zip([k for k in plan.launch if k != "num_warps"], plan.blocks))
    warps = plan.launch["num_warps"]
    if "SERIAL" in blocks or kernel.checks or plan.empty:
        return []
    fixed = {k: v for k, v in blocks.items() if k not in ("XBLOCK", "RBLOCK", "YBLOCK")}  # INDEX_64
    found: list[tuple[dict[str, int], int]] = [(blocks, warps)]
    if "YBLOCK" in blocks:
        ynumel, xnumel = plan.tile_sizes
        shapes = [(x, y) for x in (32, 64, 128) for y in (32, 64, 128) if x * y <= 8192
                  and x <= max(32, 2 * xnumel) and y <= max(32, 2 * ynumel)]
        found += [({"XBLOCK": x, "YBLOCK": y, **fixed}, w) for x, y in shapes for w in (4, 8)]
    elif "RBLOCK" in blocks:
        x0, r0 = blocks["XBLOCK"], blocks["RBLOCK"]
        rmax = 1 << max(plan.rnumel - 1, 0).bit_length()
        xmax = 1 << max(plan.xnumel - 1, 0).bit_length()
        low = r0 if getattr(kernel, "persistent", False) else max(16, r0 // 2)  # a persistent row fits one RBLOCK
        for r in _pow2_range(low, min(rmax, 2 * r0)):
            for x in {x0, min(xmax, 2 * x0), max(1, x0 // 2)}:
                if x * r <= _MAX_TILE:
                    found += [({"XBLOCK": x, "RBLOCK": r, **fixed}, w) for w in {warps, min(32, 2 * warps)}]
    else:
        x0 = blocks["XBLOCK"]
        xmax = max(64, 1 << max(plan.xnumel - 1, 0).bit_length())
        for x in _pow2_range(max(64, x0 // 4), min(xmax, 4096, 2 * x0)):
            found += [({"XBLOCK": x, **fixed}, w) for w in (4, 8) if x >= 32 * w]
    unique = list({(tuple(b.items()), w): (b, w) for b, w in found}.values())
    return unique[:MAX_CANDIDATES]


def gpu_milliseconds(launch: Callable[[], None], candidate: Any = None) -> float:
    """Median GPU time of `launch`, by Triton's benchmark helper (L2 flushed between runs)."""
    from triton.testing import do_bench

    return float(do_bench(launch, warmup=5, rep=25))


def _cache_file(kernel: Any, plan: Any, inputs: Sequence[torch.Tensor]) -> str:
    import triton

    device = inputs[0].device if inputs else torch.device("cuda")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    source = getattr(kernel.jit_function, "src", None) or kernel.__name__
    text = repr((source, plan.sizes, [stride for _, _, stride in plan.in_meta], [t.dtype for t in inputs], gpu, triton.__version__))
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    return os.path.join(kernel.options.cache_dir, "autotune", f"{digest}.json")


def _load(path: str, names: list[str]) -> tuple[dict[str, int], int] | None:
    try:
        with open(path) as f:
            saved = json.load(f)
        blocks, warps = saved["blocks"], int(saved["num_warps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(blocks, dict) or list(blocks) != names:
        return None
    return blocks, warps


def _save(path: str, blocks: dict[str, int], warps: int, milliseconds: float) -> None:
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"blocks": blocks, "num_warps": warps, "ms": milliseconds}, f)
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    except OSError as error:
        log.info("codegen_triton: could not save the tuned configuration (%s)", error)


def tune(kernel: Any, plan: Any, inputs: Sequence[torch.Tensor],
         measure: Callable[[Callable[[], None], Any], float] | None = None) -> Any:
    """`plan` with the fastest of `candidates(kernel, plan)`, timed on `inputs` by `measure`
    (milliseconds of one launch; default: `gpu_milliseconds`)."""
    configs = candidates(kernel, plan)
    if len(configs) <= 1:
        return kernel.with_blocks(plan, *configs[0], tuned=True) if configs else plan
    names = list(configs[0][0])
    path = _cache_file(kernel, plan, inputs)
    saved = _load(path, names)
    if saved is not None:
        log.debug("codegen_triton: %s %s: tuned configuration from %s", kernel.__name__, plan.sizes, path)
        return kernel.with_blocks(plan, *saved, tuned=True)
    measure = measure or gpu_milliseconds
    outputs = tuple(torch.empty_strided(size, stride, dtype=dtype, device=inputs[0].device if inputs else None)
                    for size, stride, dtype in plan.out_allocations)
    start, timed = time.perf_counter(), []
    for blocks, warps in configs:
        candidate = kernel.with_blocks(plan, blocks, warps, tuned=True)
        try:
            milliseconds = measure(lambda c=candidate: kernel.launch_plan(c, inputs, outputs), candidate)
        except Exception as error:  # noqa: BLE001 - e.g. Triton's OutOfResources: not a candidate
            log.debug("codegen_triton: %s with %s, %d warps failed: %s", kernel.__name__, blocks, warps, error)
            continue
        timed.append((milliseconds, blocks, warps))
    if not timed:
        return plan
    best_ms, blocks, warps = min(timed, key=lambda t: t[0])
    heuristic = next((ms for ms, b, w in timed if (b, w) == configs[0]), float("nan"))
    log.info("codegen_triton: tuned %s %s in %.1f s over %d configurations: %s, %d warps, %.4f ms "
             "(heuristic %.4f ms)", kernel.__name__, list(plan.sizes), time.perf_counter() - start, len(timed),
             blocks, warps, best_ms, heuristic)
    _save(path, blocks, warps, best_ms)
    return kernel.with_blocks(plan, blocks, warps, tuned=True)
