"""`TritonHandler`: the loopir ops handler that emits Triton statements for loop bodies.

Values are names of local variables holding blocks. Index variables `i0, i1, ...` (outer) and
`r0, r1, ...` (reduction) are blocks too, defined by the kernel prologue / reduction loop
header (see `kernel_source.py`); a load is masked by exactly the masks of the variables its
index uses, so every block shape broadcasts against every other:

* pointwise kernel: outer values are ``[XBLOCK]``;
* reduction kernel: outer values are ``[XBLOCK, 1]``, reduction values ``[1, RBLOCK]`` or
  ``[XBLOCK, RBLOCK]``; a reduction accumulates ``[XBLOCK, RBLOCK]`` partial results and
  folds them with `tl.sum` / `tl.reduce` after its loop.

Offsets and index expressions are printed in the flat positions ``xindex`` / ``rindex`` where
that takes fewer divisions (a contiguous access is just ``xindex``; see `indexing.py`), and
their bounds are recorded to choose the kernel's index width.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import sympy
import torch

from kiln.loopir import Kernel, index_vars, indirect_var
from kiln.loopir.codegen import TextHandler

from .indexing import flat_offset, index_bounds, inner_loop, outer_loop
from .options import TritonCodegenError
from .printer import triton_expr
from .scatter_source import scatter_update
from .welford_source import welford_source

log = logging.getLogger(__name__)

# Placeholder of a load's eviction hint until the whole kernel is emitted (`TritonHandler._eviction`).
EVICTION_MARK = "<eviction hint of {name}>"

TL_DTYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}

_UNARY = {
    "neg": "-{0}", "exp": "tl.exp({0})", "log": "tl.log({0})", "sigmoid": "tl.sigmoid({0})",
    "erf": "tl.erf({0})", "relu": "tl.where({0} < 0, 0, {0})", "abs": "tl.abs({0})",
    "sqrt": "tl.sqrt({0})", "rsqrt": "tl.rsqrt({0})", "reciprocal": "1.0 / {0}",
    "logical_not": "{0} == 0", "identity": "{0}",
    **{name: f"libdevice.{name}({{0}})" for name in (
        "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erfc", "erfinv",
        "lgamma", "exp2", "log2", "log10", "trunc", "tanh", "expm1", "log1p")},
    "round": "libdevice.rint({0})",  # half to even
    "ceil": "tl.ceil({0})", "floor": "tl.floor({0})",
    "sign": "kiln_device.sign({0})", "signbit": "kiln_device.signbit({0})",
    "isnan": "{0} != {0}", "isinf": 'tl.abs({0}) == float("inf")', "bitwise_not": "~{0}",
}
_BINARY = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "truediv": "{0} / {1}",
    "maximum": "kiln_device.maximum({0}, {1})", "minimum": "kiln_device.minimum({0}, {1})",
    "eq": "{0} == {1}", "ne": "{0} != {1}", "lt": "{0} < {1}", "le": "{0} <= {1}",
    "gt": "{0} > {1}", "ge": "{0} >= {1}",
    "logical_and": "({0} != 0) & ({1} != 0)", "logical_or": "({0} != 0) | ({1} != 0)",
    "logical_xor": "({0} != 0) ^ ({1} != 0)",
    **{name: f"kiln_device.{name}({{0}}, {{1}})" for name in (
        "floordiv", "truncdiv", "remainder", "fmod", "fmax", "fmin", "gcd", "left_shift", "right_shift")},
    **{name: f"libdevice.{name}({{0}}, {{1}})" for name in ("atan2", "hypot", "copysign", "nextafter")},
    "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}", "bitwise_xor": "{0} ^ {1}",
    "rand": "kiln_device.rand({0}, {1})", "randn": "kiln_device.randn({0}, {1})",
}
_RANDOM = {"randint64": "kiln_device.randint64({0}, {1}, {2}, {3})"}
_REDUCTION_UPDATE = {"sum": "{acc} + {v}", "prod": "{acc} * {v}", "max": "kiln_device.maximum({acc}, {v})",
                     "min": "kiln_device.minimum({acc}, {v})"}
_REDUCTION_FOLD = {"sum": "tl.sum({acc}, 1)", "prod": "tl.reduce({acc}, 1, kiln_device.multiply)",
                   "max": "tl.reduce({acc}, 1, kiln_device.maximum)",
                   "min": "tl.reduce({acc}, 1, kiln_device.minimum)"}
# scans: the block's inclusive scan along RBLOCK, and how two running values combine
_SCAN_BLOCK = {"sum": "tl.cumsum({0}, 1)", "prod": "tl.cumprod({0}, 1)",
               **{t: f"tl.associative_scan({{0}}, 1, kiln_device.{f})" for t, f in (
                   ("max", "maximum"), ("min", "minimum"), ("logaddexp", "logaddexp"))}}
_SCAN_COMBINE = {"sum": "{0} + {1}", "prod": "{0} * {1}", "max": "kiln_device.maximum({0}, {1})",
                 "min": "kiln_device.minimum({0}, {1})", "logaddexp": "kiln_device.logaddexp({0}, {1})"}
MAX_EXPANDED_POW = 16  # integer exponents up to this size become multiplications


def tl_dtype(dtype: torch.dtype, where: str) -> str:
    if dtype not in TL_DTYPES:
        raise TritonCodegenError(f"{where}: codegen_triton has no Triton type for {dtype}")
    return TL_DTYPES[dtype]


def tl_literal(value: Any, dtype: torch.dtype) -> str:
    """A Python literal Triton accepts as a `tl.full` value of `dtype`."""
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    return str(int(value))


def reduction_identity(reduction_type: str, dtype: torch.dtype) -> str:
    """The accumulator's start (for argmax/argmin: of the values compared)."""
    if reduction_type in ("sum", "prod"):
        return "0" if reduction_type == "sum" else "1"
    largest = reduction_type in ("max", "argmax")
    if dtype == torch.bool:  # a bool literal: an int one would promote the block to int32
        return "False" if largest else "True"
    if dtype.is_floating_point:
        return 'float("-inf")' if largest else 'float("inf")'
    info = torch.iinfo(dtype)
    return str(info.min if largest else info.max)


@dataclasses.dataclass(frozen=True, slots=True)
class PendingReduction:
    """A reduction's loop, as the handler leaves it for `kernel_source` to wrap in a loop."""

    reduction_type: str
    init: tuple[str, ...]  # the accumulators' definitions, before the loop
    body: list[str]  # the loop body, ending with the accumulator update


class TritonHandler(TextHandler):
    """Emits Triton statements for one kernel's loop bodies (see the module docstring). The
    shared layer (`kiln.loopir.codegen.TextHandler`) keeps the CSE scopes, registers, constants
    and checks; this class writes Triton: masked block loads and stores, flat-position
    indexing, reductions over RBLOCK chunks, and row temporaries recomputed where loaded."""

    error = TritonCodegenError

    def __init__(self, kernel: Kernel, rank: int, index_vars: frozenset[sympy.Symbol],
                 scalar_vars: frozenset[sympy.Symbol] = frozenset()) -> None:
        super().__init__(kernel)
        self.rank = rank  # 1 for pointwise kernels, 2 for kernels with a reduction
        self.index_vars = index_vars
        # Index variables one value per program (a tiled kernel's dims outside the tile, from
        # zindex): an address of only these is a scalar, as a constant one is.
        self.block_vars = index_vars - scalar_vars
        self.numels = {n.name: sympy.Mul(*n.spec.size) for n in kernel.nodes}
        self.pending_reduction: PendingReduction | None = None
        # How many statements a later node of a shared reduction loop found after the loop (see
        # `reduction`): what it emits beyond them belongs in the loop's body.
        self.shared_loop_mark = 0
        # The CSE cache at the end of the current reduction loop's body: what a later node of a
        # shared loop may reuse (not the values computed after the loop).
        self.loop_cache: dict[str, str] = {}
        self.scan_init: list[str] = []  # a scan's running value, declared before its loop
        # Masks of the loop being emitted (kernel_source sets them): what an indirect index, a
        # value of that loop, is masked by where it is used.
        self.loop_masks: tuple[str, ...] = ("xmask",)
        self.indirect_masks: dict[sympy.Symbol, tuple[str, ...]] = {}
        # Ranges of r0, r1, ... in the loop being emitted (kernel_source sets them; () outside loops).
        self.loop_ranges: tuple[sympy.Expr, ...] = ()
        self.outer_loop = outer_loop(kernel.ranges)
        # False in 2-D tiled kernels (`tiling.py`): outer accesses index with i0, i1, ... only.
        self.flat_outer = True
        # A bound on every index value the emitted code computes (see `_index`): the kernel
        # uses 32-bit index arithmetic when they all fit.
        self.index_bounds: set[sympy.Expr] = set()
        # Reduction kernels (kernel_source sets it): loads in loops over rows carry L2 eviction
        # hints (see `_eviction`).
        self.eviction_hints = False
        # A persistent kernel (kernel_source sets it: `persistent_numel`): each loop over the row
        # is its one RBLOCK chunk, straight-line code, and values stay in scope (see `scope`).
        self.persistent = False

    @contextlib.contextmanager
    def scope(self, *, keep_locals: bool = True) -> Iterator[None]:
        """As `TextHandler.scope`, except in a persistent kernel: its passes over the row are one
        straight-line block, so what one pass loaded or computed (a row's values, a recomputed
        row temporary) is reused by the later passes, not loaded again."""
        if self.persistent:
            yield
            return
        with super().scope(keep_locals=keep_locals):
            yield

    def literal(self, value: Any, dtype: torch.dtype) -> str:
        return f"tl.full({self._scalar_shape()}, {tl_literal(value, dtype)}, {tl_dtype(dtype, self._where())})"

    def _where(self) -> str:
        return f"{self.kernel.name}, buffer {self.node_name()}"

    def _masks(self, expr: sympy.Expr) -> list[str]:
        symbols = sympy.sympify(expr).free_symbols
        names = {s.name[0] for s in symbols if s in self.index_vars}
        masks = {m for s in symbols for m in self.indirect_masks.get(s, ())}
        loop = [m for prefix, m in (("i", "xmask"), ("r", "rmask")) if prefix in names or m in masks]
        return loop + sorted(masks - {"xmask", "rmask"})

    def _index(self, expr: sympy.Expr) -> str:
        """An index expression (in the loop variables and sizes) as Triton source, in the flat
        positions of the loops being emitted where that takes fewer divisions (`flat_offset`).
        Records bounds of the values it computes (`index_bounds`)."""
        loops = (self.outer_loop,)
        if self.loop_ranges:
            loops += (inner_loop(self.loop_ranges),)
        expr = flat_offset(sympy.sympify(expr), loops if self.flat_outer else loops[1:])
        maxima = {ind: sympy.Integer(0) for ind in self.indirect_masks}  # 64-bit (`indirect_indexing`)
        for loop in loops:
            maxima[loop.flat] = loop.numel - 1
            maxima.update({var: size - 1 for var, size in zip(loop.variables, loop.sizes)})
        self.index_bounds |= index_bounds(expr, maxima)
        return triton_expr(expr)

    def _offset(self, index: sympy.Expr) -> str:
        """A pointer offset, parenthesized unless it is one symbol or number."""
        text = self._index(index)
        return text if text.isidentifier() or text.isdigit() else f"({text})"

    def _scalar_shape(self) -> str:
        return "[1]" if self.rank == 1 else "[1, 1]"

    def load(self, name: str, index: sympy.Expr) -> str:
        if name in self.row_temporaries:
            return self._recompute(name, index)
        local = self.local(name)
        if local is not None:
            return local
        masks = self._masks(index)
        # A row node's buffer is read back from memory by later loops of its own kernel.
        pointer = f"{self.pointer(name)} + {self._offset(index)}"
        if not masks:  # one element for every lane: a scalar load, always in bounds
            return self.var(f"tl.load({pointer})")
        mask = " & ".join(masks)
        if not sympy.sympify(index).free_symbols & self.block_vars:
            # no block-shaped variable in the index (x[c] for a constant index tensor c, or a
            # tiled kernel's zindex dims): the pointer may be a scalar, which a block mask cannot
            # mask; broadcast it to the mask's shape
            mask = self.var(mask) if len(masks) > 1 else mask
            pointer = f"{pointer} + tl.zeros({mask}.shape, tl.int32)"
        return self.var(f"tl.load({pointer}, {mask}{self._eviction(name, masks, index)})")

    def _eviction(self, name: str, masks: list[str], index: sympy.Expr) -> str:
        """A load of a row's elements in a loop over rows of a reduction kernel is marked with
        `EVICTION_MARK`: `kernel_source.resolve_eviction` makes it `evict_first` where it is the
        kernel's only read of that buffer (the row streams through L2 once) and drops the mark
        where a loop reads the buffer again. Measured on an H200 (`tools/bench_gpu_rows.py
        --graphs`, BENCHMARKS.md session 13): sums over rows and columns read 3-13% faster with
        evict_first; `evict_last` on the reads a later loop repeats (Inductor's rule) made
        softmax and long-row var_mean 5-20% slower, so those loads carry no hint. Nor do loads
        whose index misses an outer variable (a split column sum's per-row statistics, read by
        the programs of every column block): other programs read the same elements."""
        if not self.eviction_hints or "rmask" not in masks or "xmask" not in masks:
            return ""
        outer = {var for var, size in zip(index_vars(len(self.kernel.ranges)), self.kernel.ranges) if size != 1}
        if outer - sympy.sympify(index).free_symbols:
            return ""
        return EVICTION_MARK.format(name=name)

    def _recompute(self, name: str, index: sympy.Expr) -> str:
        """A row temporary's value where the current loop loads it: its node's body, emitted
        here, inside that loop (loads of other row temporaries in it recompute those in turn).

        loopir's scheduler fuses loads of a row node only at the index where it is stored, in
        the kernel's variables; that is the element the current iteration computes, provided
        the loop's r0, r1, ... run over the kernel's row ranges. Within one loop the value is
        computed once: it is a `cache` entry, dropped with the loop's other values after it.
        """
        node = self.row_temporaries[name][0]
        stored = self.row_temporary_index(name, index)
        self._check_row_loop(name, stored)
        key = f"<row temporary {name}>"  # not an expression: never a `var` text
        if key not in self.cache:
            saved, self.node = self.node, node
            node.run(self, *self.kernel.placement(node))
            self.node = saved
            self.cache[key] = self.locals.pop(name)  # `store` put it there; its scope is the cache's
        return self.cache[key]

    def _check_row_loop(self, name: str, stored: sympy.Expr) -> None:
        """The loop being emitted defines each row variable of `stored` over the same range as
        the kernel's row loops (where the row temporary's elements live)."""
        rows = self.kernel.row_ranges
        for pos, var in enumerate(index_vars(len(rows), "r")):
            if var not in stored.free_symbols:
                continue
            if pos >= len(self.loop_ranges) or sympy.expand(self.loop_ranges[pos] - rows[pos]) != 0:
                raise TritonCodegenError(
                    f"{self._where()}: reads row temporary {name}, whose rows run over {list(rows)}, in a loop "
                    f"over {list(self.loop_ranges)}: {var} differs, so it cannot be recomputed there")

    def store(self, name: str, index: sympy.Expr, value: str) -> None:
        if not self.keep(name, value):
            return
        self._check_coverage(name, index)
        offset = self._offset(index)
        masks = self._masks(index)
        if "xmask" not in masks:  # broadcast the pointer over the outer points: a block store
            offset = f"{offset} + tl.zeros_like(xindex)"
        mask = " & ".join(["xmask"] + [m for m in masks if m != "xmask"])
        self.lines.append(f"tl.store(out_{name} + {offset}, {value}, {mask})")

    def _check_coverage(self, name: str, index: sympy.Expr) -> None:
        """The store of output `name` reaches as many positions as the buffer has elements.

        Each program stores at the points of the loops it runs; an index that leaves out a
        varying loop variable (or pins one to 0) stores some elements several times and never
        writes others, which then hold whatever the allocator's memory held.
        """
        ranges = dict(zip(index_vars(len(self.kernel.ranges)), self.kernel.ranges))
        ranges.update(zip(index_vars(len(self.loop_ranges), "r"), self.loop_ranges))
        used = sympy.sympify(index).free_symbols & set(ranges)
        reached = sympy.Mul(*(ranges[v] for v in used))
        numel = self.numels[name]
        if reached.is_Integer and numel.is_Integer and reached < numel:
            raise TritonCodegenError(f"{self._where()}: stores {name} at {index}, which reaches {reached} "
                                     f"positions, but {name} has {numel} elements: the rest would never be "
                                     "written")

    def reduction(self, name: str, reduction_type: str, dtype: torch.dtype, value: Any) -> Any:
        """Ends the loop body: what was emitted so far runs once per RBLOCK chunk. A later node of
        a shared loop (`kernel_source.shared_reduction_loops`) adds what it emitted since the
        loop closed (`shared_loop_mark`), then its accumulator's update, to that loop's body;
        values it shares with earlier nodes of the loop are the loop's own (`loop_cache`)."""
        shared = self.loop_body is not None
        if shared:
            after = self.lines[:self.shared_loop_mark]
            self.loop_body.extend(self.lines[self.shared_loop_mark:])
            self.lines = self.loop_body
        if reduction_type in ("argmax", "argmin"):
            init, fold = self._arg_reduction(name, reduction_type, dtype, *value)
        elif reduction_type == "welford":
            init, fold = self._welford(name, dtype, value)
        else:
            init, fold = self._accumulate(name, reduction_type, dtype, value)
        self.loop_cache = dict(self.cache)
        if shared:
            self.lines = after
            pending = self.pending_reduction
            self.pending_reduction = dataclasses.replace(pending, init=pending.init + init)
        else:
            self.pending_reduction = PendingReduction(reduction_type, init, self.end_loop_body())
        self.loop_masks, self.loop_ranges = ("xmask",), ()
        return fold()

    def _accumulate(self, name: str, reduction_type: str, dtype: torch.dtype, value: str
                    ) -> tuple[tuple[str, ...], Callable[[], str]]:
        """Each lane accumulates its values; the fold combines the lanes after the loop."""
        acc = f"acc_{name}"
        identity = reduction_identity(reduction_type, dtype)
        masked = self.var(f"tl.where(xmask & rmask, {value}, {identity})")
        target = tl_dtype(dtype, self._where())
        self.lines.append(f"{acc} = " + _REDUCTION_UPDATE[reduction_type].format(acc=acc, v=masked))
        init = (f"{acc} = tl.full([XBLOCK, RBLOCK], {identity}, {target})",)
        return init, functools.partial(self.var, _REDUCTION_FOLD[reduction_type].format(acc=acc) + "[:, None]")

    def _arg_reduction(self, name: str, reduction_type: str, dtype: torch.dtype, value: str, position: str
                       ) -> tuple[tuple[str, ...], Callable[[], str]]:
        """Each lane keeps its best value and that value's position (a strictly better value or
        the first NaN replaces them); the fold picks the best lane, the lowest position on ties."""
        best, at = f"best_{name}", f"acc_{name}"
        identity = reduction_identity(reduction_type, dtype)
        masked = self.var(f"tl.where(xmask & rmask, {value}, {identity})")
        compare = ">" if reduction_type == "argmax" else "<"
        take = self.var(f"({masked} {compare} {best}) | (({masked} != {masked}) & ({best} == {best}))")
        self.lines += [f"{at} = tl.where({take}, {position}, {at})", f"{best} = tl.where({take}, {masked}, {best})"]
        init = (f"{best} = tl.full([XBLOCK, RBLOCK], {identity}, {tl_dtype(dtype, self._where())})",
                f"{at} = tl.zeros([XBLOCK, RBLOCK], tl.int64)")
        return init, functools.partial(self.var, f"tl.reduce(({best}, {at}), 1, kiln_device.{reduction_type}_combine)"
                                                 "[1][:, None]")

    def _welford(self, name: str, dtype: torch.dtype, value: str) -> tuple[tuple[str, ...], Callable[[], tuple]]:
        """The row's mean, m2 (sum of squared deviations) and count in one pass (`welford_source`)."""
        target = tl_dtype(dtype, self._where())
        source = welford_source(name, self.var(f"{value}.to({target})"), target)
        self.lines += source.update

        def fold() -> tuple[str, str, str]:
            self.lines += source.fold
            return source.results

        return source.init, fold

    def store_reduction(self, name: str, index: sympy.Expr, value: str) -> None:
        self.store(name, index, value)

    def scatter(self, name: str, index: sympy.Expr, value: str, mode: str) -> None:
        """One chunk of a `Scatter` node's source stored or combined into its buffer (see
        `scatter_source.py`), masked by the chunk's mask and its indices' range checks."""
        node = next(n for n in self.kernel.nodes if n.name == name)
        dtype = node.spec.dtype
        where = self._where()
        try:
            self.lines += scatter_update(f"out_{name}", self._offset(index), value, mode,
                                         " & ".join(["rmask", *(m for m in self._masks(index) if m != "rmask")]),
                                         dtype, tl_dtype(dtype, where), tl_dtype(node.body.dtype, where))
        except NotImplementedError as exc:
            raise TritonCodegenError(f"{where}: {exc} is not supported by codegen_triton") from exc

    def scan(self, name: str, scan_type: str, dtype: torch.dtype, value: str) -> str:
        """The running value at each lane of this RBLOCK chunk: the chunk's own inclusive scan
        combined with `carry_<name>`, the scan of every earlier chunk (declared before the loop:
        `scan_init`), which then takes in this chunk's last value. Lanes past the row's end
        come after every real element, so they change nothing that is stored."""
        carry = f"carry_{name}"
        target = tl_dtype(dtype, self._where())
        if scan_type in ("argmax", "argmin"):
            return self._arg_scan(name, scan_type, dtype, *value)
        identity = "0" if scan_type == "sum" else "1" if scan_type == "prod" else reduction_identity(
            "max" if scan_type in ("max", "logaddexp") else "min", dtype)
        self.scan_init = [f"{carry} = tl.full([XBLOCK, 1], {identity}, {target})"]
        block = self.var(f"tl.broadcast_to({value}.to({target}), [XBLOCK, RBLOCK])")
        running = self.var(_SCAN_COMBINE[scan_type].format(carry, self.var(_SCAN_BLOCK[scan_type].format(block))))
        self.lines.append(f"{carry} = {self._last_lane(running)}")
        return running

    def _last_lane(self, block: str) -> str:
        """Each row's value at the chunk's last lane, as an [XBLOCK, 1] block."""
        return self.var(f"tl.sum(tl.where(rbase == RBLOCK - 1, {block}, 0), 1)[:, None]")

    def _arg_scan(self, name: str, scan_type: str, dtype: torch.dtype, value: str, position: str) -> str:
        """cummax/cummin's positions: a scan of (value, position) pairs, combined with the
        running pair of earlier chunks (`best_<name>`, `at_<name>`)."""
        best, at = f"best_{name}", f"at_{name}"
        target = tl_dtype(dtype, self._where())
        identity = reduction_identity("max" if scan_type == "argmax" else "min", dtype)
        self.scan_init = [f"{best} = tl.full([XBLOCK, 1], {identity}, {target})",
                          f"{at} = tl.zeros([XBLOCK, 1], tl.int64)"]
        values = self.var(f"tl.broadcast_to({value}.to({target}), [XBLOCK, RBLOCK])")
        positions = self.var(f"tl.broadcast_to({position}.to(tl.int64), [XBLOCK, RBLOCK])")
        scanned = self.var(f"tl.associative_scan(({values}, {positions}), 1, kiln_device.{scan_type}_scan_combine)")
        pair = self.var(f"kiln_device.{scan_type}_scan_combine({best}, {at}, {scanned}[0], {scanned}[1])")
        running, where = self.var(f"{pair}[0]"), self.var(f"{pair}[1]")
        self.lines += [f"{best} = {self._last_lane(running)}", f"{at} = {self._last_lane(where)}"]
        return where

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> str:
        target = tl_dtype(dtype, self._where())
        if not self._masks(expr):  # sizes only: a scalar
            return self.var(f"tl.full({self._scalar_shape()}, {self._index(expr)}, {target})")
        return self.var(f"({self._index(expr)}).to({target})")

    def to_dtype(self, x: str, dtype: torch.dtype) -> str:
        return self.var(f"{x}.to({tl_dtype(dtype, self._where())})")

    def where(self, cond: str, a: str, b: str) -> str:
        return self.var(f"tl.where({cond}, {a}, {b})")

    def indirect_indexing(self, value: str, size: sympy.Expr) -> sympy.Symbol:
        """An index computed at run time, negative values wrapped as torch does. Loads at it are
        masked by the masks of the loop it was computed in (its masked-off lanes hold no index)
        and by its range check; lanes of that loop where it is outside [0, size) store the
        check's number into `kiln_status`, which the launcher turns into an IndexError."""
        symbol = indirect_var(len(self.indirect_masks))
        code = self.add_check(IndexError, "an index is out of bounds for a dimension of size {size} "
                                          "(after wrapping negative indices)", size)
        bound = self._index(size)
        inside = f"inside_{symbol}"
        self.indirect_masks[symbol] = self.loop_masks + (inside,)
        failed = f"failed_{symbol}"
        self.lines += [f"{symbol} = {value}.to(tl.int64)",
                       f"{symbol} = tl.where({symbol} < 0, {symbol} + {bound}, {symbol})",
                       # a bool block (`!= 0`) even where the index is a scalar, for the interpreter
                       f"{failed} = ({' & '.join(self.loop_masks)} & (({symbol} < 0) | ({symbol} >= {bound}))) != 0",
                       f"tl.store(kiln_status + tl.zeros({failed}.shape, tl.int32), {code}, {failed})",
                       f"{inside} = {failed} == 0"]
        return symbol

    def pow(self, x: str, y: str) -> str:
        exponent = self.constant_value(y)
        if exponent is not None and float(exponent).is_integer() and abs(exponent) <= MAX_EXPANDED_POW:
            return self._integer_pow(x, int(exponent))
        if exponent == 0.5:
            return self.var(f"tl.sqrt({x})")
        if exponent == -0.5:
            return self.var(f"1.0 / tl.sqrt({x})")
        return self.var(f"kiln_device.pow({x}, {y})")

    def _integer_pow(self, x: str, exponent: int) -> str:
        """x ** exponent by repeated squaring (what torch does for small integer exponents)."""
        result: str | None = None
        square = x
        n = abs(exponent)
        while n:
            if n & 1:
                result = square if result is None else self.var(f"{result} * {square}")
            n >>= 1
            if n:
                square = self.var(f"{square} * {square}")
        if result is None:  # x ** 0
            return self.var(f"tl.full({self._scalar_shape()}, 1, {x}.dtype)")
        return self.var(f"1.0 / {result}") if exponent < 0 else result


TritonHandler.install_templates({**_UNARY, **_BINARY, **_RANDOM})
