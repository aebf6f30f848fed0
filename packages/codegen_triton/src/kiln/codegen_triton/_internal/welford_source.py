"""Triton statements of a `Welford` reduction (loopir's ops.reduction "welford"): the mean, m2
(sum of squared deviations) and count of a row's values, from one pass over them.

Each lane of the [XBLOCK, RBLOCK] block keeps its own running mean, m2 and count over the
values it loads, step after step (Welford's update: the count, the value's deviation from the
lane's mean, the mean moved by deviation / count, m2 grown by deviation times the deviation
from the new mean). Nothing crosses lanes inside the loop; after it, `kiln_device.welford_combine`
merges the lanes (Chan et al.'s pairwise update) in one `tl.reduce`. A longer row is read once,
not once per pass, and a step costs a division per element and no block-wide reduction (the
previous form reduced each step's chunk across the block, twice: slower than reading the row
twice, BENCHMARKS.md session 13). The states are three [XBLOCK, RBLOCK] float32 blocks: with the
launch heuristics' whole-row steps (RBLOCK up to 16384) they spill, which is why codegen_triton's
`welford` capability stays off (BENCHMARKS.md session 17: Inductor runs this update at RBLOCK 2048).

Values are shifted by the row's first value (`wshift_<node>`, taken at the first step: one
block-wide reduction per row, not per step): a lane's mean of unshifted values near 1e4 +- 1e-2
rounds to a thousandth of the spread at every update, which left m2 2% off (the norm statistics
test); decomp's var shifts by that same value. A lane that loaded nothing has count 0 and adds
nothing when merged.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class WelfordSource:
    """Statements before the loop (`init`), in its body (`update`) and after it (`fold`), and
    the names of the row's (mean, m2, count) after the fold."""

    init: tuple[str, ...]
    update: tuple[str, ...]
    fold: tuple[str, ...]
    results: tuple[str, str, str]


def welford_source(name: str, value: str, target: str) -> WelfordSource:
    """The statements reducing `value` (a block of the loop body, of Triton type `target`)
    over the loop's `rnumel` elements, for node `name`."""
    shift, mean, m2, count = (f"{part}_{name}" for part in ("wshift", "wmean", "wm2", "wcount"))
    shifted, delta, active = f"wvalue_{name}", f"wdelta_{name}", f"wactive_{name}"
    results = tuple(f"{part}_{name}" for part in ("mean", "m2", "weight"))
    return WelfordSource(
        init=(f"{shift} = tl.zeros([XBLOCK, 1], {target})",
              *(f"{state} = tl.zeros([XBLOCK, RBLOCK], {target})" for state in (mean, m2, count))),
        update=("if roffset == 0:  # the row's first value",
                f"    {shift} = tl.sum(tl.where((rbase == 0) & xmask, {value}, 0.0), 1)[:, None]",
                f"{active} = xmask & rmask",
                f"{shifted} = {value} - {shift}",
                f"{count} = tl.where({active}, {count} + 1, {count})",
                f"{delta} = {shifted} - {mean}",
                f"{mean} = tl.where({active}, {mean} + {delta} / {count}, {mean})",
                f"{m2} = tl.where({active}, {m2} + {delta} * ({shifted} - {mean}), {m2})"),
        fold=(f"{results[0]}, {results[1]}, {results[2]} = tl.reduce(({mean}, {m2}, {count}), 1, "
              "kiln_device.welford_combine)",
              f"{results[0]} = tl.where(rnumel > 0, {shift} + {results[0]}[:, None], float(\"nan\"))",
              f"{results[1]} = {results[1]}[:, None]",
              f"{results[2]} = tl.full([XBLOCK, 1], rnumel, {target})"),
        results=results)
