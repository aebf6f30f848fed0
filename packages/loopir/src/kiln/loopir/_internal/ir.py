"""IR records: buffers, loop bodies and fused kernels. All are small frozen dataclasses, and
values: equal records compare equal and hash alike (caches key on kernels).

A loop body is written as an `inner_fn` against an ops handler (see `ops.py`):

* `Pointwise.inner_fn(ops, index) -> value` computes one element at `index`.
* `Reduction.inner_fn(ops, index, rindex) -> value` computes one element to be reduced.

Constructing a `Pointwise` or `Reduction` runs `inner_fn` once and keeps what it did as its
`loop_body` (a `LoopBody`, see `body.py`); equality, hashing and every later run use that
record, never `inner_fn` again. `ComputedBuffer.run(ops, index, rindex)` replays a body with
its store, so any handler sees a complete statement list: loads, math, (reduction), store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from .body import LoopBody, record
from .ops import WELFORD_STATISTICS, Access, Printer, ReadsWrites
from .simplify import simplify_index, variable_ranges
from .sizes import (
    LOW_PRECISION,
    Expr,
    FloorDiv,
    contiguous_strides,
    flat_index,
    index_vars,
    same_exprs,
)


@dataclasses.dataclass(frozen=True, slots=True)
class BufferSpec:
    """A named tensor a kernel reads or writes: dtype, sizes and strides as sympy expressions."""

    name: str
    dtype: torch.dtype
    size: tuple[Expr, ...]
    stride: tuple[Expr, ...]

    @staticmethod
    def contiguous(name: str, dtype: torch.dtype, size: Sequence[Expr]) -> BufferSpec:
        return BufferSpec(name, dtype, tuple(size), contiguous_strides(size))

    def __str__(self) -> str:
        dims = ", ".join(str(s) for s in self.size)
        return f"{self.name}: {str(self.dtype).removeprefix('torch.')}[{dims}]"


@dataclasses.dataclass(frozen=True, slots=True)
class Pointwise:
    """One element per point of `ranges`."""

    ranges: tuple[Expr, ...]
    inner_fn: Callable[..., Any] = dataclasses.field(compare=False, repr=False)
    dtype: torch.dtype
    loop_body: LoopBody = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loop_body", record(self.inner_fn, len(self.ranges)))


@dataclasses.dataclass(frozen=True, slots=True)
class Reduction:
    """One element per point of `ranges`, reducing `inner_fn` over `reduction_ranges`."""

    ranges: tuple[Expr, ...]
    reduction_ranges: tuple[Expr, ...]
    reduction_type: str  # one of ops.REDUCTION_TYPES
    inner_fn: Callable[..., Any] = dataclasses.field(compare=False, repr=False)
    dtype: torch.dtype
    loop_body: LoopBody = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loop_body", record(self.inner_fn, len(self.ranges), len(self.reduction_ranges)))


@dataclasses.dataclass(frozen=True, slots=True)
class Welford(Reduction):
    """A reduction to one Welford statistic of `inner_fn`'s values (`statistic`, one of
    ops.WELFORD_STATISTICS): their "mean", "m2" (the sum of squared deviations from the mean)
    or "weight" (their count). `reduction_type` is "welford": `ops.reduction` gives all three
    from one pass over the values, so a codegen can run nodes that reduce the same values at the
    same place in one loop. The welford rewrite (`welford.py`) writes them for codegens with the
    `welford` capability; others never see one."""

    statistic: str = "m2"

    def __post_init__(self) -> None:
        if self.reduction_type != "welford" or self.statistic not in WELFORD_STATISTICS:
            raise ValueError(f"a Welford node reduces with 'welford' to one of {WELFORD_STATISTICS}, not "
                             f"{self.reduction_type!r} to {self.statistic!r}")
        Reduction.__post_init__(self)  # zero-argument super() fails in slotted dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class Scan(Reduction):
    """An inclusive scan (cumsum, cumprod, logcumsumexp, cummax values): `inner_fn(ops, index,
    rindex)` is the element at output position ``index[:scan_dim] + rindex + index[scan_dim:]``,
    and every position stores the combination (`reduction_type`, one of ops.SCAN_TYPES) of
    the elements up to it along the scanned dim. `ranges` are the other dims, and
    `reduction_ranges` the scanned dim's one extent: codegens run it as a loop, like a
    reduction's, that stores at each step. The scheduler gives each scan a kernel of its own."""

    scan_dim: int = 0

    def output_index(self, index: Sequence[Expr], rindex: Sequence[Expr]) -> tuple[Expr, ...]:
        return (*index[:self.scan_dim], *rindex, *index[self.scan_dim:])


@dataclasses.dataclass(frozen=True, slots=True)
class Scatter(Scan):
    """Indirect stores into a copy of `base` (scatter, scatter_add/reduce, index_put).

    The node's buffer starts as a copy of buffer `base` (same sizes and strides: the codegen's
    runtime copies it before the kernel runs); then, for each source element in order,
    `inner_fn(ops, (), rindex)` returns ``(value, flat_index)``: the value to store and where in
    the node's buffer (an index built with `ops.indirect_indexing`, so bounds are checked as for
    loads), and `ops.scatter` stores or combines it (`mode`, one of ops.SCATTER_MODES).

    It is a `Scan` over the flattened source (`ranges` is ``()``, `reduction_ranges` the source's
    element count), so it gets a kernel of its own and codegens that emit scans run it as one
    sequential loop in source order: accumulations are then reproducible bit for bit. A codegen
    may run the source elements in parallel instead when it combines them atomically.
    """

    mode: str = "store"
    base: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ComputedBuffer:
    """A buffer defined by a loop body; `spec` is its (contiguous) layout."""

    spec: BufferSpec
    body: Pointwise | Reduction
    origins: tuple[str, ...] = ()  # names of the ATen nodes this buffer computes
    # (index, rindex) -> ReadsWrites: the scheduler, `verify` and the codegens ask for a node's
    # accesses at the same few placements many times; each is worked out once per node.
    _accesses: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ranges(self) -> tuple[Expr, ...]:
        return self.body.ranges

    @property
    def reduction_ranges(self) -> tuple[Expr, ...]:
        return self.body.reduction_ranges if isinstance(self.body, Reduction) else ()

    def run(self, ops: Any, index: Sequence[Expr], rindex: Sequence[Expr] = ()) -> Any:
        """Emit the whole body, store included, on `ops`.

        Index variables of size-1 ranges are replaced by 0, so every access is written in
        the variables that actually vary (a `[4, 1]` buffer is stored at `i0`, not `i0 + i1`).
        """
        index = _pin_unit_dims(index, self.ranges)
        rindex = _pin_unit_dims(rindex, self.reduction_ranges)
        if isinstance(self.body, Scatter):
            return self._run_scatter(ops, rindex)
        scan = isinstance(self.body, Scan)
        out_index = flat_index(self.body.output_index(index, rindex) if scan else index, self.spec.stride)
        ranges = {**variable_ranges(index, self.ranges), **variable_ranges(rindex, self.reduction_ranges)}
        body_ops = _SimplifyingOps(ops, ranges) if ranges else ops
        if ranges:  # a row node over cut loop variables stores at their recombined position
            out_index = simplify_index(out_index, ranges)
        value = self.body.loop_body.replay(body_ops, index, rindex)
        # A value computed in float32 for a bfloat16/float16 buffer is rounded here, once.
        rounds = self.spec.dtype in LOW_PRECISION and self.body.dtype != self.spec.dtype
        if isinstance(self.body, Pointwise):
            return ops.store(self.name, out_index, ops.to_dtype(value, self.spec.dtype) if rounds else value)
        if scan:
            acc = ops.scan(self.name, self.body.reduction_type, self.body.dtype, value)
            return ops.store(self.name, out_index, ops.to_dtype(acc, self.spec.dtype) if rounds else acc)
        acc = ops.reduction(self.name, self.body.reduction_type, self.body.dtype, value)
        if isinstance(self.body, Welford):
            acc = acc[WELFORD_STATISTICS.index(self.body.statistic)]
        if rounds and self.body.reduction_type not in ("argmax", "argmin"):
            acc = ops.to_dtype(acc, self.spec.dtype)
        return ops.store_reduction(self.name, out_index, acc)

    def _run_scatter(self, ops: Any, rindex: Sequence[Expr]) -> Any:
        ranges = variable_ranges(rindex, self.reduction_ranges)
        body_ops = _SimplifyingOps(ops, ranges) if ranges else ops
        value, index = self.body.loop_body.replay(body_ops, (), rindex)
        index = simplify_index(index, ranges) if ranges else index
        if self.spec.dtype in LOW_PRECISION and self.body.dtype != self.spec.dtype:
            value = ops.to_dtype(value, self.spec.dtype)
        return ops.scatter(self.name, index, value, self.body.mode)

    def accesses(self) -> ReadsWrites:
        """Loads and stores in the node's own variables (i0, ..., r0, ...)."""
        return self.accesses_at(index_vars(len(self.ranges)), index_vars(len(self.reduction_ranges), "r"))

    def accesses_at(self, index: Sequence[Expr], rindex: Sequence[Expr] = ()) -> ReadsWrites:
        """Loads and stores of the body run at `index`/`rindex` (cached; do not modify it)."""
        key = (tuple(index), tuple(rindex))
        found = self._accesses.get(key)
        if found is None:
            found = ReadsWrites()
            if isinstance(self.body, Scatter):  # the copy of `base` the buffer starts as
                found.accesses.append(Access(self.body.base, sympy.Integer(0), "load"))
            self.run(found, index, rindex)
            self._accesses[key] = found
        return found

    def __str__(self) -> str:
        printer = Printer()
        self.run(printer, index_vars(len(self.ranges)), index_vars(len(self.reduction_ranges), "r"))
        kind = type(self.body).__name__
        head = f"{self.spec} = {kind}(ranges={list(self.ranges)}"
        if isinstance(self.body, Scatter):
            head += f", scatter ({self.body.mode}) into a copy of {self.body.base} over {list(self.body.reduction_ranges)}"
        elif isinstance(self.body, Scan):
            head += f", scan over dim {self.body.scan_dim} of {list(self.body.reduction_ranges)}, {self.body.reduction_type}"
        elif isinstance(self.body, Reduction):
            head += f", reduction_ranges={list(self.body.reduction_ranges)}, {self.body.reduction_type}"
            head += f" {self.body.statistic}" if isinstance(self.body, Welford) else ""
        return head + ")\n" + "\n".join("    " + line for line in printer.lines)


class _SimplifyingOps:
    """Forwards every op to `ops`; load and index_expr indices are first simplified with
    the loop variables' ranges (see `simplify.py`)."""

    __slots__ = ("_ops", "_ranges")

    def __init__(self, ops: Any, ranges: dict[sympy.Symbol, int]) -> None:
        self._ops = ops
        self._ranges = ranges

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def load(self, name: str, index: Expr) -> Any:
        return self._ops.load(name, simplify_index(index, self._ranges))

    def index_expr(self, expr: Expr, dtype: torch.dtype) -> Any:
        return self._ops.index_expr(simplify_index(expr, self._ranges), dtype)


def _pin_unit_dims(index: Sequence[Expr], ranges: Sequence[Expr]) -> tuple[Expr, ...]:
    return tuple(sympy.Integer(0) if r == 1 else i for i, r in zip(index, ranges))


def same_up_to_unit_dims(a: Sequence[Expr], b: Sequence[Expr]) -> bool:
    """Whether ranges `a` and `b` are the same once their size-1 dims are dropped."""
    return same_exprs([r for r in a if r != 1], [r for r in b if r != 1])


def is_row_of(node: ComputedBuffer, ranges: Sequence[Expr], row_ranges: Sequence[Expr], split: bool = True) -> bool:
    """Whether pointwise `node` iterates `ranges` followed by `row_ranges` (size-1 dims aside):
    one row of a row reduction, e.g. `exp(x - amax(x, -1))` beside the amax over the last dim.
    The same elements in the same order with dims merged count too (a `[96, 512, 512]` view of
    `[8, 12, 512]` x `[512]`), and, with `split`, with loop dims cut (see `merged_index`)."""
    if not isinstance(node.body, Pointwise) or not row_ranges:
        return False
    if same_up_to_unit_dims(node.ranges, (*ranges, *row_ranges)):
        return True
    return _merged_row_index(node, ranges, row_ranges, split) is not None


def _merged_row_index(node: ComputedBuffer, ranges: Sequence[Expr], row_ranges: Sequence[Expr], split: bool = True
                      ) -> tuple[Expr, ...] | None:
    variables = (*index_vars(len(ranges)), *index_vars(len(row_ranges), "r"))
    index = merged_index(node.ranges, (*ranges, *row_ranges), variables, split=split)
    if index is None or not any(sympy.sympify(e).free_symbols & set(variables[len(ranges):]) for e in index):
        return None
    return index


def merged_index(node_ranges: Sequence[Expr], ranges: Sequence[Expr],
                 variables: Sequence[sympy.Symbol] | None = None, split: bool = False) -> tuple[Expr, ...] | None:
    """When each of `node_ranges` is the product of consecutive `ranges` (constant sizes,
    e.g. a `[512, 1024]` node in a `[4, 128, 1024]` loop nest), the node's index in the loop
    variables: ``(128*i0 + i1, i2)``; else None. Size-1 dims take no variable.

    With `split`, a loop dim may also be cut into digits shared by consecutive node dims, as
    long as both walk the same elements in the same order: a group norm's `[8, 32, 16, 16]`
    output over its statistics' loops `[8, 4]` x `[2048]` is
    ``(i0, 8*i1 + r0//256, Mod(r0//16, 16), Mod(r0, 16))``.
    """
    if not all(sympy.sympify(r).is_Integer and int(r) > 0 for r in [*node_ranges, *ranges]):
        return None
    ivars = tuple(variables) if variables is not None else index_vars(len(ranges))
    loops = [(ivars[k], int(size)) for k, size in enumerate(ranges) if int(size) != 1]
    index: list[Expr] = []
    position, left = 0, loops[0][1] if loops else 1  # `left`: the extent of loop `position` not taken yet
    for extent in map(int, node_ranges):
        term, product = sympy.Integer(0), 1
        while product < extent and position < len(loops):
            var, size = loops[position]
            take = left
            if product * left > extent:
                take = extent // product
                if not split or extent % product or left % take:
                    return None
            below = left // take  # the extent of the digits of `var` after this one
            digit = var if below == 1 else FloorDiv(var, below)
            digit = digit if left == size else sympy.Mod(digit, take)
            term, product, left = term * take + digit, product * take, below
            if left == 1:
                position += 1
                left = loops[position][1] if position < len(loops) else 1
        if product != extent:
            return None
        index.append(sympy.expand(term))
    if position < len(loops):
        return None
    return tuple(index)


def placement(node: ComputedBuffer, ranges: Sequence[Expr], row_ranges: Sequence[Expr]
              ) -> tuple[tuple[Expr, ...], tuple[Expr, ...]]:
    """The (index, rindex) to run `node` with inside a kernel whose outer loops iterate
    `ranges` (variables i0, i1, ...) and whose row loops iterate `row_ranges` (r0, r1, ...).

    Outer nodes (pointwise or reductions over `ranges`) get the outer variables; a row node
    (see `is_row_of`) gets the varying outer variables followed by the row variables; a
    pointwise node over merged outer dims (see `merged_index`) gets their flat positions.
    The variable of a size-1 outer range is the constant 0 wherever it would appear, so
    codegens need define only the variables that vary.
    """
    index, rindex = _placement(node, ranges, row_ranges)
    unit = {var: 0 for var, size in zip(index_vars(len(ranges)), ranges) if size == 1}
    if unit:
        index = tuple(sympy.sympify(e).subs(unit) for e in index)
    return index, rindex


def outer_index(node_ranges: Sequence[Expr], ranges: Sequence[Expr]) -> tuple[Expr, ...] | None:
    """A node's index over its outer `node_ranges` in the variables of a kernel whose outer loops
    iterate `ranges`, when both are the same ranges up to size-1 dims (a bias gradient's
    `[1, 768]` beside a layer norm weight's `[768]`: ``(0, i0)``; sizes may be symbolic); else
    None. Dims merged do not count: for a reduction, equal element counts in other dims are a
    coincidence of sizes (a `[32]` column sum beside `[2, 16]` row sums), not the same outputs."""
    if same_exprs(node_ranges, ranges):
        return index_vars(len(ranges))
    if not same_up_to_unit_dims(node_ranges, ranges):
        return None
    varying = [v for v, r in zip(index_vars(len(ranges)), ranges) if r != 1]
    return tuple(sympy.Integer(0) if r == 1 else varying.pop(0) for r in node_ranges)


def _placement(node: ComputedBuffer, ranges: Sequence[Expr], row_ranges: Sequence[Expr]
               ) -> tuple[tuple[Expr, ...], tuple[Expr, ...]]:
    ivars = index_vars(len(ranges))
    if not same_exprs(node.ranges, ranges) and isinstance(node.body, Pointwise):
        merged = merged_index(node.ranges, ranges)
        if merged is not None and not is_row_of(node, ranges, row_ranges):
            return merged, ()
    if not same_exprs(node.ranges, ranges) and isinstance(node.body, Reduction):
        # A reduction over the kernel's outer elements, in other dims: its own reduction loop.
        outer = outer_index(node.ranges, ranges)
        if outer is not None:
            return outer, index_vars(len(node.reduction_ranges), "r")
    if not is_row_of(node, ranges, row_ranges) or same_exprs(node.ranges, ranges):
        return ivars, index_vars(len(node.reduction_ranges), "r")
    if not same_up_to_unit_dims(node.ranges, (*ranges, *row_ranges)):
        return _merged_row_index(node, ranges, row_ranges), ()
    varying = [v for v, r in zip(ivars, ranges) if r != 1]
    varying += [v for v, r in zip(index_vars(len(row_ranges), "r"), row_ranges) if r != 1]
    index = []
    for r in node.ranges:
        index.append(sympy.Integer(0) if r == 1 else varying.pop(0))
    return tuple(index), ()


@dataclasses.dataclass(frozen=True, slots=True)
class Kernel:
    """Fused loop nest: nodes run in order at every point of the outer `ranges`.

    A node either iterates exactly `ranges` (pointwise, or a reduction with its own inner
    loop), or is a *row node*: pointwise over `ranges` + `row_ranges`, run in its own inner
    loop (softmax, layer norm: reductions over the last dims and the pointwise work on the
    same rows fuse into one pass per row).

    Called as ``kernel(*inputs, *symbol_values)`` it returns a tuple of new tensors, one per
    entry of `outputs`; calling a `Kernel` object runs the reference evaluator, and codegens
    replace it with a compiled function of the same signature.

    `rows` and `placements` are the scheduler's decisions, recorded when it built the kernel:
    which nodes are row nodes, and the (index, rindex) each node runs at (see `placement`).
    A kernel built by hand may leave them None: they are then worked out from the ranges.
    """

    name: str
    nodes: tuple[ComputedBuffer, ...]
    inputs: tuple[BufferSpec, ...]
    outputs: tuple[BufferSpec, ...]
    symbols: tuple[sympy.Symbol, ...]
    rows: frozenset[str] | None = None
    placements: tuple[tuple[str, tuple[Expr, ...], tuple[Expr, ...]], ...] | None = None
    # (output, input) buffer names: the output is stored into that input's memory (a graph
    # input the graph mutates; `input_stores.py`): a runtime passes the input tensor as the
    # output's storage instead of allocating it (`kiln.loopir.codegen.input_stores`).
    stored_inputs: tuple[tuple[str, str], ...] = ()
    _hash: int | None = dataclasses.field(default=None, init=False, compare=False, repr=False)

    @property
    def __name__(self) -> str:  # FX names call_function targets by __name__
        return self.name

    @property
    def ranges(self) -> tuple[Expr, ...]:
        """The outer loops: the first reduction's ranges (row nodes may come before it, e.g. a
        residual add before a layer norm), else the first node's."""
        return next((n.ranges for n in self.nodes if isinstance(n.body, Reduction)), self.nodes[0].ranges)

    @property
    def row_ranges(self) -> tuple[Expr, ...]:
        """What row nodes iterate inside each outer point: the first reduction's ranges."""
        for node in self.nodes:
            if isinstance(node.body, Reduction):
                return node.reduction_ranges
        return ()

    def is_row(self, node: ComputedBuffer) -> bool:
        """A pointwise node run in its own loop over `row_ranges` inside each outer point. Later
        loops of the kernel read it where it was stored: from memory when it is an output,
        otherwise as the codegen keeps it (see `row_temporaries`)."""
        if self.rows is not None:
            return node.name in self.rows
        return not same_exprs(node.ranges, self.ranges) and is_row_of(node, self.ranges, self.row_ranges)

    def placement(self, node: ComputedBuffer) -> tuple[tuple[Expr, ...], tuple[Expr, ...]]:
        """The (index, rindex) codegens run `node` with (see the module function)."""
        for name, index, rindex in self.placements or ():
            if name == node.name:
                return index, rindex
        return placement(node, self.ranges, self.row_ranges)

    def accesses(self, node: ComputedBuffer) -> ReadsWrites:
        """`node`'s loads and stores in this kernel's loop variables."""
        return node.accesses_at(*self.placement(node))

    @property
    def row_temporaries(self) -> tuple[ComputedBuffer, ...]:
        """Row nodes that are not outputs (`lower(..., row_temporaries=True)`): no other kernel
        reads them; their values live for one outer point, and the kernel's later loops read
        them at the (outer, row) point where they were stored."""
        out = {o.name for o in self.outputs}
        return tuple(n for n in self.nodes if n.name not in out and self.is_row(n))

    @property
    def temporaries(self) -> tuple[ComputedBuffer, ...]:
        """Nodes whose buffer never leaves the kernel (codegen keeps them in registers)."""
        out = {o.name for o in self.outputs}
        return tuple(n for n in self.nodes if n.name not in out)

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        from .evaluate import evaluate_kernel

        return evaluate_kernel(self, args)

    def __str__(self) -> str:
        lines = [f"kernel {self.name}({', '.join(str(i) for i in self.inputs)}"
                 f"{''.join(', ' + str(s) for s in self.symbols)}) -> ({', '.join(o.name for o in self.outputs)})"]
        for node in self.nodes:
            lines += ["  " + line for line in str(node).splitlines()]
        return "\n".join(lines)

    def __hash__(self) -> int:  # computed once: kernels are hashed as cache keys and FX targets
        found = self._hash
        if found is None:
            found = hash((self.name, self.nodes, self.inputs, self.outputs, self.symbols, self.rows,
                          self.placements, self.stored_inputs))
            object.__setattr__(self, "_hash", found)
        return found
