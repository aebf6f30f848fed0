"""Triton statements of a `Welford` reduction (loopir's ops.reduction "welford"): the mean, m2
(sum of squared deviations) and count of a row's values, from one pass over them.

Each RBLOCK step of the loop holds its chunk of the row in registers: the chunk's mean, then
the sum of squared deviations from it (two passes over registers), which
`kiln_device.welford_step` combines with the row's running mean and m2 (Chan et al.'s pairwise
update: the counts are the step's, so nothing is divided per element). A row that fits one step
is thus the in-register two-pass; a longer row is read once, not once per pass. The state is
one value per row ([XBLOCK, 1]): no per-lane accumulators take registers from the loads.

Values are shifted by the row's first value (`wshift_<node>`, taken at the first step), so a
large mean costs no precision when chunk means are combined, as decomp's var shifts by that
same value.
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
    shift, mean, m2 = (f"{part}_{name}" for part in ("wshift", "wmean", "wm2"))
    results = tuple(f"{part}_{name}" for part in ("mean", "m2", "weight"))
    return WelfordSource(
        init=tuple(f"{state} = tl.zeros([XBLOCK, 1], {target})" for state in (shift, mean, m2)),
        update=("if roffset == 0:  # the row's first value",
                f"    {shift} = tl.sum(tl.where((rbase == 0) & xmask, {value}, 0.0), 1)[:, None]",
                f"{mean}, {m2} = kiln_device.welford_step({mean}, {m2}, {value} - {shift}, xmask & rmask, roffset, "
                "tl.minimum(rnumel - roffset, RBLOCK))"),
        fold=(f"{results[0]} = tl.where(rnumel > 0, {shift} + {mean}, float(\"nan\"))",
              f"{results[1]} = {m2}",
              f"{results[2]} = tl.full([XBLOCK, 1], rnumel, {target})"),
        results=results)
