"""`KernelGraph`: the scheduled program as an FX GraphModule that calls kernels and externs.

Its placeholders are those of the ATen graph it came from (same calling convention). Kernel
nodes call `Kernel` objects (the reference evaluator until a codegen swaps in compiled code),
extern nodes call the ATen op itself, and size symbols needed at run time are read off input
tensors with `aten.sym_size` / `aten.sym_stride`, so the module runs as-is under any shapes
its guards allow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._sympy.functions import CeilToInt, FloorToInt, IntTrueDiv

from .graph_runtime import copied_view, ensure_layout, internal_view, restrided_buffer, strided_view
from .ir import Kernel
from .lower import ExternCall, LoweredGraph, LoweringError, step_specs
from .output_views import overlaps
from .schedule import FusionDecision, Schedule
from .sizes import FloorDiv
from .values import StridedView

aten = torch.ops.aten
log = logging.getLogger(__name__)


def _unview_outputs(graph: fx.Graph, copy_shared: bool) -> None:
    """A `strided_view` that is the only reader of a kernel's or an extern's buffer (an output
    computed in memory order: a channels-last value, `(x + 1).t()`; a padded matmul's result cut
    back) becomes a `restrided_buffer`: same storage and strides, no view of another tensor.
    With `copy_shared` (outputs leave through an `autograd.Function`), an output that views a
    kernel's or an extern's buffer something else reads is a `copied_view`: modifiable in place."""
    for node in graph.nodes:
        if node.target is strided_view and _computed_buffer(node.args[0]) and len(node.args[0].users) == 1:
            node.target = restrided_buffer
    if not copy_shared:
        return
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    shared = {n for n in output.all_input_nodes if n.target is strided_view and _computed_buffer(n.args[0])
              and not overlaps(n.args[1], n.args[2])}  # eager writes no overlapping view in place either
    for node in shared:
        with graph.inserting_before(output):
            copy = graph.call_function(copied_view, node.args)
        output.replace_input_with(node, copy)


def _kernel_buffer(node: Any) -> bool:
    return (isinstance(node, fx.Node) and node.target is operator.getitem and isinstance(node.args[0], fx.Node)
            and isinstance(node.args[0].target, Kernel))


def _computed_buffer(node: Any) -> bool:
    """A kernel's or an extern's result (not a graph input, nor a view of one); a result of a
    multi-output extern is its `getitem` passed through `ensure_layout`."""
    if not isinstance(node, fx.Node):
        return False
    if node.target is ensure_layout and isinstance(node.args[0], fx.Node) and node.args[0].target is operator.getitem:
        node = node.args[0].args[0]
    return _kernel_buffer(node) or isinstance(node.target, torch._ops.OpOverload)


@dataclasses.dataclass(frozen=True, slots=True)
class KernelGraph:
    """A lowered, scheduled graph: `gm` runs it; `kernels` and `decisions` describe it."""

    gm: fx.GraphModule
    kernels: tuple[Kernel, ...]
    externs: tuple[ExternCall, ...]
    decisions: tuple[FusionDecision, ...]
    _key: list = dataclasses.field(default_factory=list, init=False, compare=False, repr=False)  # key(), once

    def __call__(self, *args: Any) -> Any:
        return self.gm(*args)

    def key(self) -> tuple[Any, ...]:
        """What the kernel graph computes, as a hashable value: the wrapper's code, the kernels,
        the extern calls, the fusion decisions and the module's attributes (tensor constants by
        dtype, layout and content). Two lowerings of the same graph have equal keys; `==` and
        `hash` compare keys."""
        if not self._key:  # computed once: tensor constants are hashed by content
            attributes = tuple((n.target, _frozen(_get_attr(self.gm, n.target)))
                               for n in self.gm.graph.nodes if n.op == "get_attr")
            self._key.append((self.gm.code, self.kernels, _frozen(self.externs), self.decisions, attributes))
        return self._key[0]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KernelGraph) and (self is other or self.key() == other.key())

    def __hash__(self) -> int:
        try:
            return hash(self.key())
        except AttributeError:  # hashed while being built (e.g. by a tracer): no content yet
            return object.__hash__(self)

    def __str__(self) -> str:
        parts = [self.gm.code.strip()]
        parts += [str(k) for k in self.kernels]
        parts += [str(e) for e in self.externs]
        decisions = "\n".join(["fusion decisions:"] + ["  " + str(d) for d in self.decisions])
        return "\n\n".join(parts + [decisions])

    def with_kernels(self, compiled: dict[str, Callable[..., Any]]) -> fx.GraphModule:
        """A copy of `gm` whose kernel calls go to `compiled[kernel.name]` (for codegens)."""
        graph = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for node in self.gm.graph.nodes:
            new = graph.node_copy(node, lambda n: env[n])
            if isinstance(node.target, Kernel):
                new.target = compiled[node.target.name]
            env[node] = new
        gm = fx.GraphModule(self.gm, graph)
        return gm


def _frozen(value: Any) -> Any:
    """`value` as a hashable value: lists as tuples, tensors by metadata and content (a fake
    tensor, which has none, by identity)."""
    if isinstance(value, torch.Tensor):
        meta = (value.dtype, tuple(value.shape), tuple(value.stride()), str(value.device))
        if isinstance(value, FakeTensor) or value.device.type == "meta":
            return (*meta, "no data", id(value))
        data = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        return (*meta, hashlib.sha256(data.numpy().tobytes()).hexdigest())
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, ExternCall):
        return (value.spec, value.op, _frozen(value.args), _frozen(value.kwargs), value.origins, value.items)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


class _Builder:
    def __init__(self, source: fx.GraphModule, lowered: LoweredGraph) -> None:
        self.source = source
        self.lowered = lowered
        self.graph = fx.Graph()
        self.root = torch.nn.Module()
        self.buffers: dict[str, fx.Node] = {}
        self.symbols: dict[sympy.Symbol, fx.Node] = {}
        self.raw_inputs: dict[str, fx.Node] = {}  # placeholders/get_attrs before ensure_layout
        self.symbol_sources: dict[sympy.Symbol, tuple[str, int, str]] = {}
        # Values given as expressions of symbols, each with what reads it at run time: SymInt
        # inputs like `s27 + s44`, then input sizes like `Min(s0, s53)` and strides like `s0 + 1`
        # (a diagonal's), in the order `_solved` tries them.
        self.expressions: list[tuple[sympy.Expr, Callable[[], fx.Node]]] = []
        # Symbols known only inside a Min, Max or floor division, each with the value passed
        # for it, in terms of that expression (see `_stand_in`).
        self.stand_ins: dict[sympy.Symbol, sympy.Expr] = {}
        self.solving: set[sympy.Symbol] = set()

    def inputs(self) -> None:
        # A symbol is read off a size when any input has it as one: a stride equals a size
        # only while the input keeps its traced layout, and sizes are what loops run over.
        strides = []
        for graph_input in self.lowered.inputs:
            if graph_input.kind == "get_attr":
                value = _get_attr(self.source, graph_input.target)
                attr = graph_input.node_name
                setattr(self.root, attr, value) if not isinstance(value, torch.Tensor) else \
                    self.root.register_buffer(attr, value)
                node = self.graph.get_attr(attr)
            else:
                node = self.graph.placeholder(graph_input.node_name)
            if graph_input.spec is not None:
                self.buffers[graph_input.spec.name] = self.raw_inputs[graph_input.spec.name] = node
                for dim, (size, stride) in enumerate(zip(graph_input.spec.size, graph_input.spec.stride)):
                    self._offer_symbol(size, graph_input.node_name, dim, "size")
                    strides.append((stride, graph_input.node_name, dim))
            elif isinstance(graph_input.symbol, sympy.Symbol):
                self.symbols[graph_input.symbol] = node
                if graph_input.stands_for is not None:
                    self.expressions.append((graph_input.stands_for, lambda node=node: node))
        for stride, name, dim in strides:
            self._offer_symbol(stride, name, dim, "stride")
        for graph_input in self.lowered.inputs:
            spec = graph_input.spec
            if graph_input.kind == "placeholder" and spec is not None and spec.size:
                self.buffers[spec.name] = self.graph.call_function(
                    ensure_layout, (self.raw_inputs[spec.name], [self.expr(st) for st in spec.stride]))

    def _offer_symbol(self, expr: sympy.Expr, name: str, dim: int, kind: str) -> None:
        if isinstance(expr, sympy.Symbol):
            self.symbol_sources.setdefault(expr, (name, dim, kind))
        elif sympy.sympify(expr).free_symbols:
            self.expressions.append((sympy.sympify(expr), lambda: self._read(name, dim, kind)))

    def _read(self, name: str, dim: int, kind: str) -> fx.Node:
        """The run-time size or stride `dim` of graph input `name`."""
        op = aten.sym_size.int if kind == "size" else aten.sym_stride.int
        return self.graph.call_function(op, (self.raw_inputs[name], dim))

    def symbol(self, sym: sympy.Symbol) -> fx.Node:
        if sym not in self.symbols:
            solved = self._solved(sym) if sym not in self.symbol_sources else None
            if solved is not None:
                self.symbols[sym] = solved
                return solved
            if sym not in self.symbol_sources:
                stand_in = self._stand_in(sym)
                if stand_in is None:
                    raise LoweringError(f"size symbol {sym} is not a size or stride of any graph input, "
                                        "and no SymInt input provides it")
                self.symbols[sym] = stand_in
                return stand_in
            self.symbols[sym] = self._read(*self.symbol_sources[sym])
        return self.symbols[sym]

    def _solved(self, sym: sympy.Symbol) -> fx.Node | None:
        """`sym` computed from a value given as an expression of it and of other known sizes (see
        `_inverted`): a SymInt input (a region given `start + s27` for a negative narrow start),
        an input's size or stride (a diagonal's stride `s0 + 1` when no input has `s0` as a
        size, only `Min(s0, s53)`); None if none gives it."""
        for expression, read in self.expressions:
            if sym not in expression.free_symbols or (expression.free_symbols - {sym}) & self.solving:
                continue
            self.solving.add(sym)
            try:
                value = self._inverted(expression, sym, read)
            except LoweringError:  # a size it needs is known nowhere either
                value = None
            finally:
                self.solving.discard(sym)
            if value is not None:
                return value
        return None

    def _inverted(self, expression: sympy.Expr, sym: sympy.Symbol, read: Callable[[], fx.Node]) -> fx.Node | None:
        """`sym` as nodes computing it from `read()`, the run-time value of `expression`, when
        that is `sym` under sums and products with terms free of it (`s0 + 1`, `s0*s27*s53`,
        `s0*s6**2 + 1`, `s0 - start`): each term is undone in turn, a product by an exact division
        by sizes or nonzero integers. None for anything else (`Min(s0, s53)`, `FloorDiv(s0, 2)`)."""
        undo = []
        while expression != sym:
            if isinstance(expression, sympy.Add):
                rest, expression = expression.as_independent(sym, as_Add=True)
                undo.append((operator.sub, rest))
            elif isinstance(expression, sympy.Mul):
                rest, expression = expression.as_independent(sym, as_Add=False)
                if not all(_nonzero_factor(f) for f in sympy.Mul.make_args(rest)):
                    return None  # a factor that may be 0 at run time
                undo.append((operator.floordiv, rest))
            else:
                return None
        known = [(fn, self.expr(rest)) for fn, rest in undo]  # first: may raise, before any read
        value = read()
        for fn, rest in known:
            value = self.graph.call_function(fn, (value, rest))
        return value

    def _stand_in(self, sym: sympy.Symbol) -> fx.Node | None:
        """For a symbol the inputs give only inside a Min, Max or floor division (a diagonal of
        an (s53, s0) matrix has size `Min(s0, s53)`, a `[..., ::2]` slice `(s53 + 1)//2`), a
        value that leaves that expression's value unchanged: the Min's value itself, `2*m - 1`
        for `m = (s53 + 1)//2`. Every size expression that uses `sym` only inside it keeps its
        value; `check_stand_ins` rejects a graph that uses `sym` elsewhere. None if none does."""
        for expression, read in self.expressions:
            for atom in sorted(expression.atoms(sympy.Min, sympy.Max, FloorDiv), key=str):
                inverse = _inverse(atom, sym)
                if inverse is None or (expression.free_symbols - {sym}) & self.solving:
                    continue
                scale, shift = inverse
                stand_ins = {**self.stand_ins, sym: scale * atom + shift}
                if not all(_unchanged(known, stand_ins) for known, _ in self.expressions):
                    continue
                self.solving.add(sym)
                try:
                    value = self._inverted(expression, atom, read)
                except LoweringError:
                    value = None
                finally:
                    self.solving.discard(sym)
                if value is not None:
                    self.stand_ins = stand_ins
                    if scale != 1:
                        value = self.graph.call_function(operator.mul, (value, scale))
                    return self.graph.call_function(operator.add, (value, shift)) if shift else value
        return None

    def check_stand_ins(self, expressions: list[Any], where: str) -> None:
        """Raise if one of the size `expressions` computed at run time (by `where`) changes its
        value with the stand-ins (see `_stand_in`) in place of their symbols."""
        for expression in map(sympy.sympify, expressions):
            if not _unchanged(expression, self.stand_ins):
                symbols = ", ".join(sorted(str(s) for s in expression.free_symbols & self.stand_ins.keys()))
                inside = ", ".join(sorted({str(stand_in) for stand_in in self.stand_ins.values()}))
                raise LoweringError(f"size symbol {symbols} is not a size or stride of any graph input (known "
                                    f"only as {inside}) and {where} needs it in {expression}")

    def expr(self, expr: Any) -> Any:
        """A sympy size expression as an int or as FX nodes computing it at run time."""
        value = self._computed(expr)
        self.check_stand_ins([expr], "the kernel graph")
        return value

    def _computed(self, expr: Any) -> Any:
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return int(expr)
        if isinstance(expr, sympy.Symbol):
            return self.symbol(expr)
        ops = {sympy.Add: operator.add, sympy.Mul: operator.mul, FloorDiv: operator.floordiv,
               sympy.Mod: operator.mod, sympy.Max: torch.sym_max, sympy.Min: torch.sym_min}
        for kind, fn in ops.items():
            if isinstance(expr, kind):
                result = self._computed(expr.args[0])
                for arg in expr.args[1:]:
                    result = self.graph.call_function(fn, (result, self._computed(arg)))
                return result
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
            return self.graph.call_function(operator.pow, (self._computed(expr.base), int(expr.exp)))
        rounded = _rounded_quotient(expr)
        if rounded is not None:  # ceil(a / b) as -(-a // b), floor(a / b) as a // b
            up, (a, b) = rounded
            if not up:
                return self.graph.call_function(operator.floordiv, (self._computed(a), self._computed(b)))
            negated = self.graph.call_function(operator.neg, (self._computed(a),))
            quotient = self.graph.call_function(operator.floordiv, (negated, self._computed(b)))
            return self.graph.call_function(operator.neg, (quotient,))
        raise LoweringError(f"cannot compute size expression {expr} at run time")

    def tensor(self, view: StridedView, internal: bool = True) -> fx.Node:
        """The FX node for a view of a buffer (the buffer itself when the layout matches);
        `internal`: read only by the graph's own calls, not returned."""
        base = self.buffers[view.buffer]
        spec = self._spec(view.buffer)
        if list(view.size) == list(spec.size) and list(view.stride) == list(spec.stride) and view.offset == 0:
            return base
        return self.graph.call_function(internal_view if internal else strided_view, (
            base, [self.expr(s) for s in view.size], [self.expr(s) for s in view.stride], self.expr(view.offset)))

    def _spec(self, name: str):
        for graph_input in self.lowered.inputs:
            if graph_input.spec is not None and graph_input.spec.name == name:
                return graph_input.spec
        for step in self.lowered.steps:
            for spec in step_specs(step):
                if spec.name == name:
                    return spec
        raise KeyError(name)

    def kernel(self, kernel: Kernel) -> None:
        args = [self.buffers[i.name] for i in kernel.inputs] + [self.symbol(s) for s in kernel.symbols]
        if self.stand_ins.keys() & set(kernel.symbols):
            self.check_stand_ins(_kernel_expressions(kernel), f"kernel {kernel.name}")
        call = self.graph.create_node("call_function", kernel, tuple(args), name=kernel.name)
        for pos, out in enumerate(kernel.outputs):
            self.buffers[out.name] = self.graph.create_node(
                "call_function", operator.getitem, (call, pos), name=out.name)

    def extern(self, extern: ExternCall) -> None:
        def convert(arg: Any) -> Any:
            if isinstance(arg, StridedView):
                return self.tensor(arg)
            if isinstance(arg, (list, tuple)):
                return type(arg)(convert(a) for a in arg)
            if isinstance(arg, sympy.Expr):
                return self.expr(arg)
            return arg

        args = tuple(convert(a) for a in extern.args)
        kwargs = {k: convert(v) for k, v in extern.kwargs}
        if not extern.items:
            self.buffers[extern.name] = self.graph.create_node(
                "call_function", extern.op, args, kwargs, name=extern.name)
            return
        call = self.graph.create_node("call_function", extern.op, args, kwargs, name=f"{extern.name}_results")
        for pos, spec in enumerate(extern.items):
            if spec is not None:  # in the layout its meta promised, or a copy in it
                item = self.graph.call_function(operator.getitem, (call, pos))
                self.buffers[spec.name] = self.graph.create_node(
                    "call_function", ensure_layout, (item, [self.expr(st) for st in spec.stride]), name=spec.name)

    def output(self, as_tuple: bool) -> None:
        outs = []
        for value in self.lowered.outputs:
            if isinstance(value, StridedView):
                outs.append(self.tensor(value, internal=False))
            elif isinstance(value, sympy.Expr):
                outs.append(self.expr(value))
            else:
                outs.append(value)
        if self.lowered.output_spec is not None:  # a nested structure: rebuilt around the nodes
            self.graph.output(pytree.tree_unflatten(outs, self.lowered.output_spec))
            return
        self.graph.output(tuple(outs) if as_tuple else outs[0])


def _rounded_quotient(expr: sympy.Expr) -> tuple[bool, tuple[sympy.Expr, sympy.Expr]] | None:
    """(rounds up, (a, b)) for torch's CeilToInt/FloorToInt of IntTrueDiv(a, b) (sizes such as
    an attention's logsumexp padded to a multiple of 32), else None."""
    if not isinstance(expr, (CeilToInt, FloorToInt)) or not isinstance(expr.args[0], IntTrueDiv):
        return None
    return isinstance(expr, CeilToInt), tuple(expr.args[0].args)


def _inverse(atom: sympy.Expr, sym: sympy.Symbol) -> tuple[int, int] | None:
    """(scale, shift) such that `sym = scale*atom + shift` leaves `atom` unchanged, or None:
    (1, 0) for a Min/Max of `sym` (Min(Min(s0, s1), s1) is Min(s0, s1)), (c, -b) for `(sym + b)//c`."""
    if sym not in atom.free_symbols:
        return None
    if isinstance(atom, (sympy.Min, sympy.Max)):
        return 1, 0
    base, divisor = atom.args
    shift = base - sym
    if divisor.is_Integer and divisor > 0 and shift.is_Integer:
        return int(divisor), -int(shift)
    return None


def _nonzero_factor(factor: sympy.Expr) -> bool:
    """A nonzero integer, or a backed size symbol or a positive power of one (Dynamo specializes
    sizes 0 and 1; an unbacked one, `u0`, may be 0)."""
    if factor.is_Pow and factor.exp.is_Integer and factor.exp > 0:
        factor = factor.base
    if factor.is_Symbol:
        return not factor.name.startswith("u")
    return factor.is_Integer and factor != 0


def _unchanged(expression: sympy.Expr, stand_ins: dict[sympy.Symbol, sympy.Expr]) -> bool:
    """Whether `expression` is the same with `stand_ins` in place of their symbols (a floor
    division of a multiple of its divisor divided out: `(2*((s + 1)//2))//2` is `(s + 1)//2`)."""
    if not expression.free_symbols & stand_ins.keys():
        return True
    replaced = expression.xreplace(stand_ins).replace(FloorDiv, _exact_floor_division)
    return replaced == expression


def _exact_floor_division(base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr:
    coefficient, rest = base.as_coeff_Mul()
    if divisor.is_Integer and coefficient.is_Integer and coefficient % divisor == 0 and rest.is_integer:
        return (coefficient // divisor) * rest
    return FloorDiv(base, divisor)


def _kernel_expressions(kernel: Kernel) -> list[Any]:
    """The size expressions a kernel is built from: its nodes' ranges, layouts, placements,
    load/store indices and index values, and its buffers' layouts."""
    found: list[Any] = []
    for node in kernel.nodes:
        found += [*node.ranges, *node.reduction_ranges, *node.spec.size, *node.spec.stride]
        for placed in (node.accesses(), kernel.accesses(node)):
            found += [access.index for access in placed.accesses] + placed.index_exprs
        found += [e for part in kernel.placement(node) for e in part]
    return found + [e for spec in (*kernel.inputs, *kernel.outputs) for e in (*spec.size, *spec.stride)]


def _get_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def build_kernel_graph(source: fx.GraphModule, lowered: LoweredGraph, plan: Schedule,
                       copy_shared_views: bool = False) -> KernelGraph:
    """The kernel graph running `plan`'s kernels and externs. Outputs are never views of a
    kernel's buffer nothing else reads (`restrided_buffer`); with `copy_shared_views`, outputs
    that view a computed buffer are copies (`_unview_outputs`)."""
    builder = _Builder(source, lowered)
    builder.inputs()
    for item in plan.items:
        builder.kernel(item) if isinstance(item, Kernel) else builder.extern(item)
    output_node = next(n for n in source.graph.nodes if n.op == "output")
    builder.output(isinstance(output_node.args[0], (tuple, list)))
    _unview_outputs(builder.graph, copy_shared_views)
    gm = fx.GraphModule(builder.root, builder.graph)
    kernels = tuple(i for i in plan.items if isinstance(i, Kernel))
    externs = tuple(i for i in plan.items if isinstance(i, ExternCall))
    return KernelGraph(gm, kernels, externs, plan.decisions)
