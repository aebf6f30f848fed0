"""`FusionDecision`: the scheduler's record of why a buffer joined a kernel or started one.

A record of its own (the scheduler writes it, reports read it), so that reading a stored report
(kiln's whole-graph cache) imports no scheduling.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class FusionDecision:
    """Why `buffer` joined `kernel` (`fused`) or started it: `kind` is one of `FUSED_KINDS` or
    `BLOCKER_KINDS`; `detail` says which buffers, ranges or indices decided it."""

    buffer: str
    kernel: str
    fused: bool
    kind: str
    detail: str = ""

    def __post_init__(self) -> None:
        kinds = FUSED_KINDS if self.fused else BLOCKER_KINDS
        if self.kind not in kinds:
            raise ValueError(f"fusion decision kind {self.kind!r} is not one of {sorted(kinds)}")

    @property
    def reason(self) -> str:
        text = (FUSED_KINDS if self.fused else BLOCKER_KINDS)[self.kind]
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        verb = "fused into" if self.fused else "starts"
        return f"{self.buffer} {verb} {self.kernel}: {self.reason}"


FUSED_KINDS = {
    "same_ranges": "same ranges, reads kernel buffers where they were stored",
    "merged_dims": "its dims merge the kernel's, reads kernel buffers where they were stored",
    "row": "a row of the kernel's reduction, reads kernel buffers where they were stored",
    "row_prologue": "a reduction over the rows of the kernel's pointwise nodes, which run as row loops "
                    "before it; reads kernel buffers where they were stored",
}
BLOCKER_KINDS = {
    "first": "first buffer",
    "closed_by_extern": "the open kernel was closed by an extern that reads it",
    "ranges_differ": "ranges differ from the kernel's",
    "reads_elsewhere": "reads a kernel buffer not where it was stored",
    "scan": "a scan runs in a kernel of its own",
    "walks_across": "as a row of the kernel's reduction it would walk memory across the reduction's order",
}
