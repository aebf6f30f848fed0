"""The welford rewrite: a variance's second pass over its values folds into its first.

kiln computes a variance in two passes (decomp's `_var_and_mean` for var/var_mean/std, and the
layer, group and batch norm decompositions): the sum of the values ``v`` over a row, then the
sum of their squared deviations from its mean, ``sum((v - sum(v) / n) ** 2)``. Inside one fused
kernel the second reduction reads the row again, from memory once rows outgrow a block. For a
codegen with the `welford` capability (`LowerOptions.welford`), `welford_kernel` finds such pairs
and turns the second into a `Welford` node reducing ``v`` itself to its "m2" (Welford's one-pass
sum of squared deviations). Both nodes then reduce the same values at the same place, which a
codegen runs as one loop reading each element once. What ``v`` is stays as it was (data shifted by
the row's first element, for var; upcast bfloat16 values), and so does the sum: a plain sum, whose
value (infinities included) is unchanged. Nodes only the old second pass read are dropped.

Matching works on values, not on the shape of the recorded bodies: each node's reduced value is
rebuilt by value numbering (`_ValueNumbers`), where loads of the kernel's own pointwise buffers
(row temporaries, a mean stored by a node of its own) stand for what those nodes compute, so the
pattern is found however the scheduler split, stored or recomputed its parts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import sympy
import torch

from .body import Constant, LoopBody
from .ir import ComputedBuffer, Kernel, Pointwise, Reduction, Welford
from .ops import OPS, OpsHandler
from .schedule import Schedule

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class _Value:
    """Value number `n`: equal numbers, equal values."""

    n: int


class _Unfollowed(Exception):
    """A body uses an op value numbering does not follow (indirect indexing, scans, scatters)."""


class _ValueNumbers(OpsHandler):
    """Numbers the values the nodes of one kernel compute (see the module docstring). `key(v)`
    is ``(op, *args)`` of value `v`, its value operands `_Value`s."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.nodes = {node.name: node for node in kernel.nodes}
        self._numbers: dict[tuple[Any, ...], _Value] = {}
        self._keys: list[tuple[Any, ...]] = []
        self._computed: dict[str, _Value | None] = {}
        self._result: _Value | None = None

    def key(self, value: _Value) -> tuple[Any, ...]:
        return self._keys[value.n]

    def computed(self, node: ComputedBuffer) -> _Value | None:
        """The value `node` reduces (a reduction) or stores (pointwise); None if not followed."""
        if node.name not in self._computed:
            saved, self._result = self._result, None
            try:
                node.run(self, *self.kernel.placement(node))
                self._computed[node.name] = self._result
            except _Unfollowed:
                self._computed[node.name] = None
            finally:
                self._result = saved
        return self._computed[node.name]

    def _number(self, *key: Any) -> _Value:
        found = self._numbers.get(key)
        if found is None:
            found = self._numbers[key] = _Value(len(self._keys))
            self._keys.append(key)
        return found

    def __getattr__(self, name: str) -> Callable[..., _Value]:
        if name not in OPS:
            return super().__getattr__(name)
        return lambda *args: self._number(name, *args)

    def load(self, name: str, index: sympy.Expr) -> _Value:
        index = sympy.expand(index)
        node = self.nodes.get(name)
        if node is not None and type(node.body) is Pointwise and node.spec.dtype == node.body.dtype \
                and sympy.expand(index - stored_index(self.kernel, node)) == 0:
            value = self.computed(node)
            if value is not None:
                return value
        return self._number("load", name, index)

    def constant(self, value: Any, dtype: torch.dtype) -> _Value:
        return self._number("constant", Constant(value), dtype)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> _Value:
        return self._number("index_expr", sympy.expand(expr), dtype)

    def store(self, name: str, index: sympy.Expr, value: _Value) -> None:
        self._result = value

    def reduction(self, name: str, reduction_type: str, dtype: torch.dtype, value: Any) -> Any:
        self._result = value if isinstance(value, _Value) else None
        return (None, None, None) if reduction_type == "welford" else None

    def store_reduction(self, name: str, index: sympy.Expr, value: Any) -> None:
        return None

    def indirect_indexing(self, value: _Value, size: sympy.Expr) -> sympy.Symbol:
        raise _Unfollowed("indirect_indexing")

    def scan(self, *args: Any) -> Any:
        raise _Unfollowed("scan")

    def scatter(self, *args: Any) -> Any:
        raise _Unfollowed("scatter")


def stored_index(kernel: Kernel, node: ComputedBuffer) -> sympy.Expr:
    """Where `node` stores its value, in `kernel`'s variables."""
    return sympy.expand(kernel.accesses(node).writes[0].index)


def _is_plain_sum(kernel: Kernel, node: ComputedBuffer) -> bool:
    body = node.body
    return type(body) is Reduction and body.reduction_type == "sum" and body.dtype.is_floating_point \
        and not kernel.is_row(node)


def _squared(numbers: _ValueNumbers, value: _Value) -> _Value | None:
    """`d` when `value` is ``d * d`` or ``d ** 2``, else None."""
    op, *args = numbers.key(value)
    if op == "mul" and args[0] == args[1]:
        return args[0]
    if op == "pow" and numbers.key(args[1])[:2] == ("constant", Constant(2.0)):
        return args[0]
    return None


def _is_count(numbers: _ValueNumbers, value: _Value, count: sympy.Expr) -> bool:
    """Whether `value` is the number of elements `count` (a constant, or a size expression)."""
    op, *args = numbers.key(value)
    if op == "constant":
        number = args[0].value
        return sympy.sympify(count).is_Integer and not isinstance(number, bool) and number == int(count)
    return op == "index_expr" and sympy.expand(args[0] - count) == 0


def _mean_of(numbers: _ValueNumbers, value: _Value) -> str | None:
    """The sum node `value` divides by its element count (a mean), or None."""
    op, *args = numbers.key(value)
    if op != "truediv" or numbers.key(args[0])[0] != "load":
        return None
    _, name, index = numbers.key(args[0])
    node = numbers.nodes.get(name)
    if node is None or not _is_plain_sum(numbers.kernel, node) or index != stored_index(numbers.kernel, node):
        return None
    return name if _is_count(numbers, args[1], sympy.Mul(*node.reduction_ranges)) else None


def _first_pass(numbers: _ValueNumbers, node: ComputedBuffer) -> ComputedBuffer | None:
    """The sum whose mean `node`'s values deviate from, when `node` is the second pass of a
    variance over the same values at the same place (see the module docstring); else None."""
    kernel = numbers.kernel
    if not _is_plain_sum(kernel, node) or (value := numbers.computed(node)) is None:
        return None
    deviation = _squared(numbers, value)
    if deviation is None or numbers.key(deviation)[0] != "sub":
        return None
    _, values, mean = numbers.key(deviation)
    name = _mean_of(numbers, mean)
    if name is None:
        return None
    first = numbers.nodes[name]
    same_loop = (first.ranges, first.reduction_ranges, first.body.dtype, kernel.placement(first)) == \
        (node.ranges, node.reduction_ranges, node.body.dtype, kernel.placement(node))
    return first if same_loop and numbers.computed(first) == values else None


def _reduction_of(body: LoopBody) -> Callable[..., Any]:
    return lambda ops, index, rindex: body.replay(ops, index, rindex)


def welford_kernel(kernel: Kernel) -> Kernel:
    """`kernel` with each variance's second pass a `Welford` "m2" of its first pass's values
    (see the module docstring), and the nodes only those passes read dropped; `kernel` itself
    when it has none."""
    numbers = _ValueNumbers(kernel)
    nodes = list(kernel.nodes)
    rewritten: list[str] = []
    for position, node in enumerate(nodes):
        first = _first_pass(numbers, node)
        if first is None:
            continue
        body = Welford(node.ranges, node.reduction_ranges, "welford", _reduction_of(first.body.loop_body),
                       node.body.dtype, statistic="m2")
        nodes[position] = ComputedBuffer(node.spec, body, node.origins)
        rewritten.append(node.name)
        log.debug("%s: %s is the Welford m2 of the values %s sums", kernel.name, node.name, first.name)
    if not rewritten:
        return kernel
    kept = _live(kernel, nodes)
    return dataclasses.replace(
        kernel, nodes=tuple(n for n in nodes if n.name in kept),
        rows=None if kernel.rows is None else kernel.rows & kept,
        placements=None if kernel.placements is None else tuple(p for p in kernel.placements if p[0] in kept))


def _live(kernel: Kernel, nodes: list[ComputedBuffer]) -> frozenset[str]:
    """Names of `nodes` that are outputs of `kernel` or read by a live node after them."""
    live = {output.name for output in kernel.outputs}
    for node in reversed(nodes):
        if node.name in live:
            live |= {access.buffer for access in kernel.accesses(node).reads}
    return frozenset(node.name for node in nodes if node.name in live)


def welford_schedule(plan: Schedule) -> Schedule:
    """`plan` with `welford_kernel` applied to each of its kernels."""
    items = tuple(welford_kernel(item) if isinstance(item, Kernel) else item for item in plan.items)
    return dataclasses.replace(plan, items=items)
