"""`schedule`: group computed buffers into fused `Kernel`s and record why.

Fusion rule (vertical fusion): a buffer joins the kernel being built when it iterates over the
same outer ranges and reads every buffer of that kernel exactly where it was stored (same
index). Then one loop nest computes them all, and a value consumed only inside the kernel
never touches memory. Every decision, made or refused, is kept with its reason.
"""

from __future__ import annotations

import dataclasses
import logging

import sympy

from .fusion_records import FusionDecision
from .ir import (
    BufferSpec,
    ComputedBuffer,
    Kernel,
    Pointwise,
    Reduction,
    Scan,
    is_row_of,
    merged_index,
    outer_index,
    placement,
    same_up_to_unit_dims,
)
from .lower import ExternCall, LoweredGraph, step_names, step_specs
from .ops import ReadsWrites
from .row_cuts import cut_row_ranges, recut_reduction
from .sizes import free_size_symbols, same_exprs
from .values import StridedView

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    items: tuple[Kernel | ExternCall, ...]
    decisions: tuple[FusionDecision, ...]


@dataclasses.dataclass(slots=True)
class _Group:
    name: str
    members: list[ComputedBuffer]
    stored: dict[str, sympy.Expr]  # buffer name -> where its value is stored, in kernel variables
    rows: set[str] = dataclasses.field(default_factory=set)  # row nodes (see Kernel.is_row)
    loads_seen: tuple[int, frozenset[str]] | None = None  # `_group_loads`' cache: (members, buffers)

    @property
    def ranges(self) -> tuple:
        return next((m.ranges for m in self.members if isinstance(m.body, Reduction)), self.members[0].ranges)

    @property
    def row_ranges(self) -> tuple:
        return next((m.reduction_ranges for m in self.members if isinstance(m.body, Reduction)), ())

    def accesses(self, node: ComputedBuffer) -> ReadsWrites:
        return node.accesses_at(*placement(node, self.ranges, self.row_ranges))

    def add(self, node: ComputedBuffer, row: bool = False) -> None:
        self.members.append(node)
        self.stored[node.name] = self.accesses(node).writes[0].index
        if row:
            self.rows.add(node.name)


def _fusion_blocker(group: _Group, node: ComputedBuffer, fuse_rows: bool
                    ) -> tuple[tuple[str, str] | None, str, _Group]:
    """Why `node` cannot join `group` ((kind, detail), or None when it can), how it joins
    ("same_ranges", "merged_dims" or "row"), and the group it joins: `group`, or a copy whose
    row loops are cut to fit it (`row_cuts.py`: a group norm's normalization)."""
    how = "same_ranges"
    if isinstance(node.body, Scan) or any(isinstance(m.body, Scan) for m in group.members):
        return ("scan", ""), how, group
    if not same_exprs(group.ranges, node.ranges):
        if fuse_rows and is_row_of(node, group.ranges, group.row_ranges, split=False):
            how = "row"
        elif isinstance(node.body, Pointwise) and merged_index(node.ranges, group.ranges) is not None:
            how = "merged_dims"
        elif (isinstance(node.body, Reduction) and any(isinstance(m.body, Reduction) for m in group.members)
              and outer_index(node.ranges, group.ranges) is not None):
            # A reduction over the same outer elements in other dims (a linear's bias gradient,
            # `[1, 768]`, beside a layer norm's weight gradient, `[768]`): it keeps its own
            # reduction loop; the group's ranges, set by its first reduction, stay.
            how = "merged_dims"
        elif fuse_rows and (recut := _recut_rows(group, node)) is not None:
            how, group = "row", recut
        else:
            return ("ranges_differ", f"{list(node.ranges)} against {list(group.ranges)}"), how, group
    for access in group.accesses(node).reads:
        stored = group.stored.get(access.buffer)
        if stored is not None and sympy.expand(access.index - stored) != 0:
            return ("reads_elsewhere", f"{access.buffer} at {access.index}, stored at {stored}"), how, group
    if how == "row" and (crossing := _walks_across(group, node)) is not None:
        return ("walks_across", crossing), how, group
    return None, how, group


def _unit_stride_kinds(indices) -> set[str]:
    """The kinds of kernel variables ("i": outer, "r": row) that some of `indices` step through
    memory with stride 1."""
    kinds = set()
    for index in indices:
        expanded = sympy.expand(index)
        for var in expanded.free_symbols:
            name = getattr(var, "name", "")
            if name[:1] in ("i", "r") and name[1:].isdigit() and expanded.coeff(var) == 1:
                kinds.add(name[0])
    return kinds


def _walks_across(group: _Group, node: ComputedBuffer, members: list[ComputedBuffer] | None = None) -> str | None:
    """Why row node `node` should not share `group`'s loops: its elements lie consecutively along
    the row loop while the group's reductions read consecutively along the outer loops (or the
    other way round), so one of them would step through memory with a stride on every element.
    A bias gradient (a sum over dim 0, contiguous across its outputs) would otherwise take in a
    [256, 1024] relu backward as rows of 256: loaded and stored with a stride of 256 (CPU MLP
    training step: that kernel 560 us; BENCHMARKS.md session 16). None when they agree."""
    reductions = members or [m for m in group.members if isinstance(m.body, Reduction)]
    along_reductions = _unit_stride_kinds(a.index for m in reductions for a in group.accesses(m).reads)
    accesses = group.accesses(node)
    along_node = _unit_stride_kinds(a.index for a in (*accesses.reads, *accesses.writes))
    if along_reductions and along_node and along_reductions.isdisjoint(along_node):
        kind = {"i": "outer", "r": "row"}
        return (f"{node.name} is contiguous along the {kind[min(along_node)]} loops, the reductions along the "
                f"{kind[min(along_reductions)]} loops")
    return None


def _recut_rows(group: _Group, node: ComputedBuffer) -> _Group | None:
    """`group` with its row loops cut so that `node`, the same elements as its outer x row
    loops in the same order, runs as a row node without dividing a row variable (see
    `row_cuts.py`); None when that is not so, or a reduction of `group` runs over other rows."""
    rows = cut_row_ranges(node, group.ranges, group.row_ranges)
    if rows is None:
        return None
    members = []
    for member in group.members:
        if isinstance(member.body, Reduction):
            member = recut_reduction(member, rows) if same_exprs(member.reduction_ranges, group.row_ranges) else None
            if member is None:
                return None
        members.append(member)
    recut = _Group(group.name, [], {}, set(group.rows))
    for member in members:
        recut.add(member)
    return recut


def _as_row_prologue(group: _Group, step: ComputedBuffer) -> _Group | None:
    """`group` (pointwise only) with reduction `step` appended, its nodes turned into row nodes
    of the reduction (one pass per row: `x + residual` then a layer norm over it), or None when
    they are not rows of it or `step` would not read them where they are stored."""
    if not isinstance(step.body, Reduction) or any(isinstance(m.body, Reduction) for m in group.members):
        return None
    if isinstance(step.body, Scan):
        return None
    if group.members and same_exprs(group.ranges, step.ranges):
        return None  # plain fusion: same outer ranges
    if not all(is_row_of(m, step.ranges, step.reduction_ranges, split=False) for m in group.members):
        return None
    candidate = _Group(group.name, [*group.members, step], {}, {m.name for m in group.members})
    for member in candidate.members:
        for access in candidate.accesses(member).reads:
            stored = candidate.stored.get(access.buffer)
            if stored is not None and sympy.expand(access.index - stored) != 0:
                return None
        candidate.stored[member.name] = candidate.accesses(member).writes[0].index
    if any(_walks_across(candidate, member, [step]) is not None for member in group.members):
        return None
    return candidate


def schedule(lowered: LoweredGraph, *, fuse_rows: bool = True, row_temporaries: bool = False,
             join_earlier: bool = True, join_siblings: bool = True) -> Schedule:
    """Fuse the steps of `lowered` into kernels, keeping program order valid.

    `fuse_rows`: let pointwise work over the rows a kernel's reduction runs over join it as
    row nodes (one pass per row for softmax / layer norm); codegens that cannot emit row
    loops ask for False. `row_temporaries`: a row node no other kernel reads is not a kernel
    output (`Kernel.row_temporaries`); without it, every row node's buffer is written out.
    `join_earlier`: a pointwise or reduction step that cannot join the open kernel may join an
    earlier one (`_earlier_group`); `join_siblings`: a reduction may join one only for holding a
    reduction over the same ranges too.

    Steps whose results are never used (dead code in the ATen graph) are dropped first.
    """
    items: list[_Group | ExternCall] = []
    decisions: list[FusionDecision] = []
    current: _Group | None = None
    closed_by: tuple[str, str] = ("first", "")
    for step in _live_steps(lowered):
        if isinstance(step, ExternCall):
            # An extern that reads the open kernel needs it finished first; one that does not
            # lets the kernel keep growing past it (the kernel is then ordered after it).
            if current is not None and step.reads() & {b.name for b in current.members}:
                closed_by = ("closed_by_extern", f"{current.name} by {step.name}")
                current = None
            items.append(step)
            continue
        prologue = _as_row_prologue(current, step) if fuse_rows and current is not None else None
        if prologue is not None:
            items[next(k for k, item in enumerate(items) if item is current)] = prologue
            current = prologue
            decisions.append(FusionDecision(step.name, current.name, True, "row_prologue"))
            continue
        blocker, how, joined = _fusion_blocker(current, step, fuse_rows) if current is not None else \
            (closed_by, "", None)
        if blocker is None:
            detail = ""
            if joined is not current:  # its row loops were cut to fit `step`
                detail = f"row loops {list(current.row_ranges)} cut to {list(joined.row_ranges)}"
                items[next(k for k, item in enumerate(items) if item is current)] = joined
                current = joined
            current.add(step, how == "row")
            decisions.append(FusionDecision(step.name, current.name, True, how, detail))
            continue
        earlier = _earlier_group(items, current, step, fuse_rows, join_siblings) if join_earlier else None
        if earlier is not None:  # the open kernel stays open: `step` ran with an earlier one
            group, how = earlier
            group.add(step, how == "row")
            decisions.append(FusionDecision(step.name, group.name, True, how, "an earlier kernel, whose inputs it "
                                            "reads all"))
            continue
        current = _Group(f"kernel{sum(isinstance(i, _Group) for i in items)}", [], {})
        current.add(step)
        items.append(current)
        decisions.append(FusionDecision(step.name, current.name, False, *blocker))
    ordered = _dependency_order(items)
    specs = _buffer_specs(lowered)
    used_outside = _used_outside(ordered, lowered)
    given = _given_symbols(lowered)
    result = tuple(_make_kernel(item, specs, used_outside if row_temporaries else used_outside | item.rows, given)
                   if isinstance(item, _Group) else item for item in ordered)
    return Schedule(result, tuple(decisions))


def _earlier_group(items: list, current: _Group | None, step: ComputedBuffer, fuse_rows: bool,
                   siblings: bool = True) -> tuple[_Group, str] | None:
    """(kernel, how) for a pointwise or reduction `step` that cannot join the open kernel but can
    join an earlier, closed one, or None. Candidates are the kernels all of whose inputs `step`
    reads are produced before them (or by them, read where stored) and which produce or load at
    least one of them, or, for a reduction, hold a reduction over the same outer and reduction
    ranges (with `siblings`: the bias gradients of a query, key and value projection, each over
    another matmul's result), under the rules of joining an open kernel (`_fusion_blocker`); the
    one producing or already loading most of those inputs wins (the latest on a tie). A value
    computed late in the graph from what a kernel computed (a norm's input or statistics saved
    for the backward graph) then leaves that kernel as one more output, from the values it
    holds, instead of a launch of its own reading them back; a split reduction's partial sums
    (a layer norm's weight and bias gradients) share one kernel, and their final sums another."""
    if not isinstance(step.body, (Pointwise, Reduction)) or isinstance(step.body, Scan):
        return None
    reads = {a.buffer for a in step.accesses().reads}
    produced_later: set[str] = set()
    best: tuple[float, _Group, str] | None = None
    for item in reversed(items):
        produced = _produced(item)
        if isinstance(item, _Group) and item is not current and not produced_later & reads:
            score = len(produced & reads) + len(_group_loads(item) & reads)  # values it holds or loads
            if not score and siblings and _sibling_reduction(item, step):
                score = 0.5  # below any shared input
            if score and (best is None or score > best[0]):
                blocker, how, joined = _fusion_blocker(item, step, fuse_rows)
                if blocker is None and joined is item:
                    best = (score, item, how)
        produced_later |= produced
        if not (reads - produced_later):
            break  # every input is produced by kernels already tried or later ones
    return None if best is None else (best[1], best[2])


def _sibling_reduction(group: _Group, step: ComputedBuffer) -> bool:
    """Whether reduction `step` iterates the outer and reduction ranges of a reduction of
    `group` (size-1 dims aside)."""
    return isinstance(step.body, Reduction) and any(
        isinstance(m.body, Reduction) and not isinstance(m.body, Scan)
        and same_up_to_unit_dims(step.ranges, m.ranges)
        and same_up_to_unit_dims(step.reduction_ranges, m.reduction_ranges) for m in group.members)


def _group_loads(group: _Group) -> frozenset[str]:
    """The buffers `group`'s members load, kept on the group until it grows."""
    if group.loads_seen is None or group.loads_seen[0] != len(group.members):
        group.loads_seen = (len(group.members), frozenset(_consumed(group)))
    return group.loads_seen[1]


def _live_steps(lowered: LoweredGraph) -> list:
    """The steps an output depends on, in program order."""
    live = {o.buffer for o in lowered.outputs if isinstance(o, StridedView)}
    kept = []
    for step in reversed(lowered.steps):
        if not step_names(step) & live:
            log.debug("dropping %s: its result is never used", step.name)
            continue
        kept.append(step)
        live |= step.reads() if isinstance(step, ExternCall) else {a.buffer for a in step.accesses().reads}
    return kept[::-1]


def _dependency_order(items: list) -> list:
    """Order kernels/externs so each comes after the producers of what it reads; otherwise
    keep the order of `items` (a kernel kept open across an extern moves after it)."""
    producer = {name: pos for pos, item in enumerate(items) for name in _produced(item)}
    placed: list = []
    done: set[int] = set()
    for root in range(len(items)):
        stack = [(root, False)]
        while stack:
            pos, expanded = stack.pop()
            if pos in done:
                continue
            if expanded:
                done.add(pos)
                placed.append(items[pos])
                continue
            stack.append((pos, True))
            deps = sorted({producer[n] for n in _consumed(items[pos]) if producer.get(n, pos) != pos},
                          reverse=True)
            stack.extend((d, False) for d in deps if d not in done)
    return placed


def _produced(item) -> set[str]:
    return step_names(item) if isinstance(item, ExternCall) else {b.name for b in item.members}


def _consumed(item) -> set[str]:
    if isinstance(item, ExternCall):
        return item.reads()
    return {a.buffer for b in item.members for a in b.accesses().reads}


def _used_outside(groups: list, lowered: LoweredGraph) -> set[str]:
    used = {o.buffer for o in lowered.outputs if isinstance(o, StridedView)}
    for group in groups:
        inside = _produced(group)
        used |= _consumed(group) - inside
    return used


def _buffer_specs(lowered: LoweredGraph) -> dict[str, BufferSpec]:
    specs = {i.spec.name: i.spec for i in lowered.inputs if i.spec is not None}
    for step in lowered.steps:
        specs.update((spec.name, spec) for spec in step_specs(step))
    return specs


def _given_symbols(lowered: LoweredGraph) -> set:
    """The size symbols the kernel graph reads off its inputs: plain sizes and strides of input
    tensors, and SymInt inputs."""
    given = {i.symbol for i in lowered.inputs if i.symbol is not None and i.symbol.is_Symbol}
    for graph_input in lowered.inputs:
        if graph_input.spec is not None:
            given |= {e for e in (*graph_input.spec.size, *graph_input.spec.stride) if e.is_Symbol}
    return given


def _make_kernel(item: _Group, specs: dict[str, BufferSpec], used_outside: set[str], given: set) -> Kernel:
    """The kernel of a fused group, with the scheduler's row nodes and placements recorded."""
    name, group = item.name, item.members
    produced = {b.name for b in group}
    reads: list[str] = []
    exprs: list = []
    for node in group:
        rw = node.accesses()
        exprs += list(node.ranges) + list(node.reduction_ranges) + list(node.spec.size)
        exprs += [a.index for a in rw.accesses] + rw.index_exprs
        for access in rw.reads:
            if access.buffer not in produced and access.buffer not in reads:
                reads.append(access.buffer)
    inputs = tuple(specs[r] for r in reads)
    outputs = tuple(b.spec for b in group if b.name in used_outside)
    # A runtime may evaluate every size and stride of its buffers (to check inputs, to allocate
    # outputs): their symbols are parameters too, where the kernel graph can give them.
    layouts = [e for spec in (*inputs, *outputs) for e in (*spec.size, *spec.stride)]
    exprs += [e for e in layouts if free_size_symbols([e]) <= given]
    symbols = tuple(sorted(free_size_symbols(exprs), key=lambda s: s.name))
    placements = tuple((node.name, *placement(node, item.ranges, item.row_ranges)) for node in group)
    kernel = Kernel(name, tuple(group), inputs, outputs, symbols, frozenset(item.rows), placements)
    log.debug("scheduled %s", kernel)
    return kernel
