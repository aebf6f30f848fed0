"""`lower(gm)`: an ATen FX graph -> a list of steps (computed buffers and extern calls).

The walk is define-by-run: each ATen node's lowering builds a `StridedView` or a `Lazy`
value from its inputs' values. Lazy values are inlined into their consumers (vertical fusion
by construction) and realized into a `ComputedBuffer` only when needed: a reduction result,
a value with several users, an extern's input, or a graph output.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._prims_common import compute_elementwise_output_strides

from . import philox
from .ir import BufferSpec, ComputedBuffer, Pointwise, Reduction
from .output_views import free_symbols, overlaps, view_base, view_geometry, views_like
from .recompute import recomputed_on_reuse, stored_uses
from .registry import Lowerings, default_lowerings
from .sizes import (
    SUPPORTED_DTYPES,
    Expr,
    compute_dtype,
    contiguous_strides,
    same_exprs,
    to_expr,
    to_exprs,
)
from .values import Lazy, StridedView, Value

log = logging.getLogger(__name__)


class LoweringError(NotImplementedError):
    """An ATen node loopir cannot lower; the message names the node and its source line."""


@dataclasses.dataclass(frozen=True, slots=True)
class ExternCall:
    """A call of a library kernel (mm, addmm, ...) on realized buffers."""

    spec: BufferSpec  # the output buffer, laid out as the op returns it
    op: torch._ops.OpOverload
    args: tuple[Any, ...]  # StridedView for tensors, sympy expressions or constants otherwise
    kwargs: tuple[tuple[str, Any], ...]
    origins: tuple[str, ...] = ()
    # An op returning a tuple (attention): the buffer of each result the graph uses, by
    # position (None: unused or not a tensor); `spec` is the first of them. Empty: one tensor.
    items: tuple[BufferSpec | None, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def specs(self) -> tuple[BufferSpec, ...]:
        """Every buffer the call produces."""
        return tuple(s for s in self.items if s is not None) if self.items else (self.spec,)

    def reads(self) -> set[str]:
        values = list(self.args) + [v for _, v in self.kwargs]
        return {v.buffer for v in values if isinstance(v, StridedView)}

    def __str__(self) -> str:
        args = ", ".join(_describe(a) for a in self.args)
        results = ", ".join(str(s) for s in self.specs)
        return f"{results} = extern {self.op}({args})"


def _describe(arg: Any) -> str:
    if isinstance(arg, StridedView):
        return f"{arg.buffer}[size={list(arg.size)}, stride={list(arg.stride)}, offset={arg.offset}]"
    return repr(arg)


Step = ComputedBuffer | ExternCall


def step_specs(step: Step) -> tuple[BufferSpec, ...]:
    """The buffers a step produces: one, or each used result of a multi-output extern."""
    return step.specs if isinstance(step, ExternCall) else (step.spec,)


def step_names(step: Step) -> set[str]:
    return {spec.name for spec in step_specs(step)}


@dataclasses.dataclass(frozen=True, slots=True)
class GraphInput:
    """A placeholder or get_attr of the ATen graph: a tensor buffer or a size symbol."""

    node_name: str
    kind: str  # "placeholder" | "get_attr"
    spec: BufferSpec | None  # None for SymInt / non-tensor inputs
    symbol: sympy.Expr | None  # the symbol of a SymInt placeholder
    target: str | None = None  # attribute path of a get_attr
    stands_for: sympy.Expr | None = None  # a SymInt input's expression, when `symbol` names it


@dataclasses.dataclass(frozen=True, slots=True)
class LoweredGraph:
    inputs: tuple[GraphInput, ...]
    steps: tuple[Step, ...]
    outputs: tuple[Any, ...]  # StridedView, sympy expression, or a constant (None, int)
    # The output's structure when it nests tuples/lists ((a, (b, c))): `outputs` then holds its
    # leaves and this pytree spec rebuilds it; None for one value or a flat tuple.
    output_spec: Any = None


class LoweringContext:
    """State of one lowering walk; lowering functions use it to realize values and add steps."""

    def __init__(self, recompute_cheap: bool = False, split_reductions: bool = False,
                 recompute_transcendental: bool = True) -> None:
        self.steps: list[Step] = []
        self.recompute_cheap = recompute_cheap  # see LowerOptions.recompute_cheap
        self.recompute_transcendental = recompute_transcendental  # see LowerOptions.recompute_transcendental
        self.split_reductions = split_reductions  # see LowerOptions.split_reductions
        self._counter = 0
        self._seeds: dict[torch.device, StridedView] = {}
        self._random_ops = 0
        self.eager_values: dict[fx.Node, Any] = {}  # values whose fake is laid out otherwise (correct_layout)

    def new_buffer_name(self) -> str:
        name = f"buf{self._counter}"
        self._counter += 1
        return name

    def realize(self, value: Value, like: Any = None) -> StridedView:
        """`value` as a buffer; laid out as eager lays out the tensor `like` (an ATen node's
        FakeTensor) when given and dense, else contiguous (see `eager_strides`)."""
        if isinstance(value, StridedView):
            return value
        spec = _laid_out_like(self.new_buffer_name(), value.dtype, value.size, like)
        # A low-precision value is computed in float32 and rounded once, on store (`ComputedBuffer.run`).
        self.steps.append(ComputedBuffer(spec, Pointwise(value.size, value.inner_fn, compute_dtype(value.dtype)),
                                         value.origins))
        return StridedView(spec.name, spec.dtype, spec.size, spec.stride)

    def realize_in_memory_order(self, value: Value, like: Any) -> StridedView:
        """As `realize`; a value eager lays out densely in another dim order than its logical
        one (channels-last, transposed) is computed by a loop nest in that memory order: its
        buffer is the contiguous tensor of the permuted sizes, its innermost loop walks
        consecutive elements (vectorized on CPU, coalesced on GPU), and the value is a view
        of it with eager's strides."""
        if isinstance(value, StridedView):
            return value
        stride = eager_strides(like, value.size)
        order = memory_order(like, value.size, stride) if stride else None
        if order is None:
            return self.realize(value, like)
        size = tuple(value.size[d] for d in order)
        position = [order.index(d) for d in range(len(order))]
        inner = value.inner_fn

        def in_memory_order(ops: Any, index: tuple[Expr, ...]) -> Any:
            return inner(ops, tuple(index[p] for p in position))

        spec = BufferSpec.contiguous(self.new_buffer_name(), value.dtype, size)
        self.steps.append(ComputedBuffer(spec, Pointwise(size, in_memory_order, compute_dtype(value.dtype)),
                                         value.origins))
        return StridedView(spec.name, spec.dtype, tuple(value.size), stride)

    def add_reduction(self, reduction: Reduction, size: Sequence[Expr], origin: str,
                      dtype: torch.dtype | None = None, like: Any = None) -> StridedView:
        """Realize `reduction` into a new buffer of `dtype` (default: the reduction's), laid out
        as eager lays out `like` (see `realize`)."""
        spec = _laid_out_like(self.new_buffer_name(), dtype or reduction.dtype, size, like)
        self.steps.append(ComputedBuffer(spec, reduction, (origin,)))
        return StridedView(spec.name, spec.dtype, spec.size, spec.stride)

    def add_extern(self, node: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> StridedView:
        val = node.meta["val"]
        realized = tuple(self.realize(a) if isinstance(a, (Lazy, StridedView)) else a for a in args)
        spec = BufferSpec(self.new_buffer_name(), val.dtype, to_exprs(val.shape), to_exprs(val.stride()))
        self.steps.append(ExternCall(spec, node.target, realized, tuple(kwargs.items()), (node.name,)))
        return StridedView(spec.name, spec.dtype, spec.size, spec.stride)


    def add_multi_extern(self, node: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """A call of an op returning a tuple: one buffer per tensor result a `getitem` reads
        (laid out as the op's meta says; the wrapper copies a result returned in another
        layout), the others None; ints (an attention's max sequence lengths) as they are."""
        used = {user.args[1] for user in node.users if user.target is operator.getitem}
        items, values = [], []
        for pos, val in enumerate(node.meta["val"]):
            spec = None
            if isinstance(val, torch.Tensor) and pos in used:
                spec = BufferSpec(self.new_buffer_name(), val.dtype, to_exprs(val.shape), to_exprs(val.stride()))
            items.append(spec)
            values.append(StridedView(spec.name, spec.dtype, spec.size, spec.stride) if spec is not None
                          else val if isinstance(val, int) else None)
        def stored(value: Any, arg: Any) -> Any:  # a tensor argument in eager's layout
            if not isinstance(value, (Lazy, StridedView)):
                return value
            return self.realize_in_memory_order(value, arg.meta.get("val") if isinstance(arg, fx.Node) else None)

        realized = tuple(stored(a, v) for a, v in zip(args, node.args))
        kwargs = {k: stored(v, node.kwargs.get(k)) for k, v in kwargs.items()}
        first = next((s for s in items if s is not None), None)
        if first is not None:  # a call none of whose results is read is dead code
            self.steps.append(ExternCall(first, node.target, realized, tuple(kwargs.items()), (node.name,),
                                         tuple(items)))
        return tuple(values)

    def random_stream(self, device: torch.device) -> tuple[StridedView, int]:
        """The graph's random seed on `device` and the first offset of a new random op's stream.

        The seed is one extern call of `torch.randint` per graph call, added before the first
        random op: torch's generator advances once per call, so `manual_seed` reproduces a run
        and two calls draw different numbers. The k-th random op of the graph reads offsets
        from ``k << philox.STREAM_SHIFT`` on (see `philox.py`)."""
        device = torch.device(device)
        if device not in self._seeds:
            spec = BufferSpec(self.new_buffer_name(), torch.int64, (), ())
            kwargs = {"dtype": torch.int64, "device": device}
            self.steps.append(ExternCall(spec, torch.ops.aten.randint.low, (0, philox.SEED_HIGH, []),
                                         tuple(kwargs.items()), ("random_seed",)))
            self._seeds[device] = StridedView(spec.name, torch.int64, (), ())
        start = self._random_ops << philox.STREAM_SHIFT
        self._random_ops += 1
        return self._seeds[device], start


def _laid_out_like(name: str, dtype: torch.dtype, size: Sequence[Expr], like: Any) -> BufferSpec:
    """A new buffer's spec: eager's layout of `like` where `eager_strides` gives one, else contiguous."""
    stride = eager_strides(like, size)
    return BufferSpec(name, dtype, tuple(size), stride) if stride else BufferSpec.contiguous(name, dtype, size)


def eager_strides(like: Any, size: Sequence[Expr]) -> tuple[Expr, ...] | None:
    """The strides eager gives `like` (a FakeTensor of `size`) when they lay it out densely in
    some dim order (contiguous, channels-last, a transposed layout, ...), else None. Buffers
    whose strides something may observe (graph outputs, values an eager op reads through their
    storage) get eager's layout, so what reads them by strides reads the right elements.
    Symbolic strides (dynamic shapes) are ordered by their hints, then checked to be exactly
    the dense strides of that order, as expressions (so they hold at every size)."""
    if not isinstance(like, torch.Tensor) or len(like.shape) != len(size):
        return None
    stride = tuple(_unit_max_dropped(s) for s in to_exprs(like.stride()))
    if not same_exprs(to_exprs(like.shape), size):
        return None
    if same_exprs(stride, contiguous_strides(size)):
        return None  # contiguous: the default
    hints = [_hint(s) for s in like.stride()]
    if any(h is None for h in hints):
        return None  # an unbacked (data-dependent) stride: no order known at compile time
    if all(e.is_Integer for e in (*stride, *size)):
        return stride if _non_overlapping([int(s) for s in size], hints) else None
    return stride if _symbolic_non_overlapping(size, stride, hints) else None


def _symbolic_non_overlapping(size: Sequence[Expr], stride: Sequence[Expr], hints: list[int]) -> bool:
    """`_non_overlapping` for symbolic strides, ordered by their hints: each dim's stride is at
    least the extent of the dims inside it at every size (a dense layout, or one with gaps: a
    `select` of a channels-last value, `(s0**2*s1, 1, s0)`)."""
    end: Expr = sympy.Integer(1)
    for d in sorted(range(len(size)), key=lambda d: (hints[d], -d)):
        if size[d] == 1:
            continue
        if sympy.simplify(stride[d] - end).is_nonnegative is not True:
            return False
        end = end + stride[d] * (size[d] - 1)
    return True


def _unit_max_dropped(stride: Expr) -> Expr:
    """`stride` with the `Max(1, size)` factors of torch's dense strides (which guard against
    empty dims) read as `size`: they differ only for an empty tensor, where no stride addresses
    anything. Kept, `s25*Max(1, (s63 + 1)//2)` would not be seen as dense (a sliced `to(...)`)."""
    return stride.replace(
        lambda e: isinstance(e, sympy.Max) and len(e.args) == 2 and sympy.S.One in e.args,
        lambda e: next(a for a in e.args if a != sympy.S.One))


def _non_overlapping(size: list[int], stride: list[int]) -> bool:
    """Whether no two elements of a tensor of `size` and `stride` share memory (gaps allowed:
    `empty_strided((4, 5), (8, 1))` keeps its exact strides, as eager's)."""
    if 0 in size:
        return False
    end = 1
    for d in sorted(range(len(size)), key=lambda d: (stride[d], -d)):
        if size[d] == 1:
            continue
        if stride[d] < end:
            return False
        end += stride[d] * (size[d] - 1)  # one past the last element the dims so far reach
    return True


def memory_order(like: Any, size: Sequence[Expr], stride: Sequence[Expr]) -> list[int] | None:
    """The dims of a value laid out with `stride` (eager's, dense: see `eager_strides`) from
    the outermost in memory to the innermost; None when that is the logical order or the
    layout has gaps. Dims of size 1 keep their logical place."""
    hints = [_hint(s) for s in like.stride()]
    varying = sorted((d for d in range(len(size)) if size[d] != 1), key=lambda d: (-hints[d], d))
    order = [d if size[d] == 1 else varying.pop(0) for d in range(len(size))]
    permuted = contiguous_strides([size[d] for d in order])
    if any(size[d] != 1 and sympy.simplify(permuted[k] - stride[d]) != 0 for k, d in enumerate(order)):
        return None  # gaps (empty_strided): stored with eager's strides, in logical order
    return None if order == sorted(order) else order


def _hint(value: int | torch.SymInt) -> int | None:
    """An int, or the value a SymInt had in the example inputs (None when it had none)."""
    if isinstance(value, torch.SymInt):
        return int(value.node.hint) if value.node.has_hint() else None
    return int(value)


def node_location(node: fx.Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    where = f" (from {lines[-2]}: {lines[-1]})" if len(lines) >= 2 else ""
    return f"node {node.name!r} = {node.target}{where}"


def lower_graph(gm: fx.GraphModule, lowerings: Lowerings | None = None,
                round_low_precision: bool = False, recompute_cheap: bool = False,
                split_reductions: bool = False, output_views: bool = True,
                recompute_transcendental: bool = True, input_writes: dict[int, int] | None = None) -> LoweredGraph:
    """Walk `gm` (functional ATen with meta["val"]) and build its loopir steps. With
    `round_low_precision`, every bfloat16/float16 result is rounded where its ATen op produces
    it, as eager does, instead of only where it is stored. With `recompute_cheap`, cheap values
    of several users stay index functions (`recompute.py`; arithmetic only without
    `recompute_transcendental`). With `split_reductions`, long
    reductions into few outputs run in two stages (`lower_split.py`). With `output_views`, outputs
    eager returns as views keep eager's strides as views (`_output_view`). `input_writes` maps
    output positions to the placeholder positions whose new values they are: such an output not
    stored yet is laid out as its input (`input_stores.py` may then store it there)."""
    table = lowerings if lowerings is not None else default_lowerings()
    ctx = LoweringContext(recompute_cheap, split_reductions, recompute_transcendental)
    env: dict[fx.Node, Any] = {}
    inputs: list[GraphInput] = []
    outputs: tuple[Any, ...] = ()
    output_spec = None
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            graph_input, env[node] = _lower_input(gm, node)
            inputs.append(graph_input)
        elif node.op == "call_function":
            correct_layout(node, ctx.eager_values)
            env[node] = _lower_call(ctx, table, node, env)
            if round_low_precision and isinstance(env[node], Lazy) and env[node].computed is not None:
                env[node] = _rounded(env[node])
        elif node.op == "output":
            placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
            layouts = {pos: placeholders[i].meta.get("val") for pos, i in (input_writes or {}).items()
                       if 0 <= i < len(placeholders)}
            outputs, output_spec = _lower_outputs(ctx, node, env, _input_symbols(inputs), output_views, layouts)
        else:
            raise LoweringError(f"loopir lowers ATen call_function graphs; got {node.op} {node_location(node)}")
    return LoweredGraph(tuple(inputs), tuple(ctx.steps), outputs, output_spec)


def _lower_input(gm: fx.GraphModule, node: fx.Node) -> tuple[GraphInput, Any]:
    if node.op == "placeholder" and "val" not in node.meta:
        raise LoweringError(f"placeholder {node.name!r} has no meta['val']; loopir lowers graphs traced "
                            "with fake tensors (make_fx, torch.export, Dynamo)")
    val = node.meta.get("val")
    if node.op == "get_attr" and val is None:
        val = _get_attr(gm, node.target)
    target = node.target if node.op == "get_attr" else None
    if isinstance(val, torch.Tensor):
        _check_dtype(node, val.dtype)
        spec = BufferSpec(node.name, val.dtype, to_exprs(val.shape), to_exprs(val.stride()))
        view = StridedView(node.name, val.dtype, spec.size, spec.stride)
        return GraphInput(node.name, node.op, spec, None, target), view
    if isinstance(val, (torch.SymInt, int)):
        expr = to_expr(val)
        if expr.is_Symbol or not expr.free_symbols:
            return GraphInput(node.name, node.op, None, expr, target), expr
        # A size computed outside the region (`Max(0, s17 + s77 - 1)`, `start + s27`): its
        # symbols may be sizes of no input here, so the value is a symbol of its own, bound to
        # the input; the kernel graph still solves its expression for a symbol needed alone.
        named = sympy.Symbol(f"{_INPUT_SYMBOL_PREFIX}{node.name}", integer=True)
        return GraphInput(node.name, node.op, None, named, target, stands_for=expr), named
    return GraphInput(node.name, node.op, None, None, target), val


_INPUT_SYMBOL_PREFIX = "sym_"


def _get_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _check_dtype(node: fx.Node, dtype: torch.dtype) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise LoweringError(f"dtype {dtype} is not supported by loopir yet: {node_location(node)}")


# Python arithmetic on SymInts that symbolic tracing records between size queries; the
# node's meta["val"] already holds the resulting expression.
SIZE_ARITHMETIC = frozenset({
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg,
    torch.sym_max, torch.sym_min,
})


def _lower_call(ctx: LoweringContext, table: Lowerings, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    if node.target is operator.getitem:
        return env[node.args[0]][node.args[1]]
    if "val" not in node.meta:
        raise LoweringError(f"{node_location(node)} has no meta['val']; loopir lowers graphs traced with "
                            "fake tensors (make_fx, torch.export, Dynamo)")
    if node.target in SIZE_ARITHMETIC:
        return size_expr(node)
    if node.target not in table:
        raise LoweringError(f"no loopir lowering for {node_location(node)}; "
                            "keep it out of loopir's region (partition with loopir.supported_ops())")
    check = table[node.target].check
    if check is not None and not check(node):
        raise LoweringError(f"loopir does not lower this use of {node_location(node)} (see its lowering's check; "
                            "partition with loopir.lowerable())")
    for val in _tensor_vals(node.meta.get("val")):
        _check_dtype(node, val.dtype)
    args = fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
    if any(isinstance(a, (torch.SymFloat, torch.SymBool)) for a in (*args, *kwargs.values())):
        raise LoweringError(f"symbolic float/bool scalars are not supported yet: {node_location(node)}")
    args, kwargs = _symbolic_scalars(args), {k: _symbolic_scalars(v) for k, v in kwargs.items()}
    try:
        result = table[node.target].fn(ctx, node, *args, **kwargs)
    except LoweringError:
        raise
    except Exception as exc:
        raise LoweringError(f"lowering failed for {node_location(node)}: {exc}") from exc
    if isinstance(result, Lazy) and len(node.users) > 1 and not (
            ctx.recompute_cheap and _stored_by_at_most_one(node, table)
            and recomputed_on_reuse(result, ctx.recompute_transcendental)):
        result = ctx.realize_in_memory_order(result, ctx.eager_values.get(node, node.meta.get("val")))
    return result


def _stored_by_at_most_one(node: fx.Node, table: Lowerings) -> bool:
    """Whether at most one user needs `node` in memory (an extern call, the graph's output,
    directly or through views: `recompute.stored_uses`): a cheap value that each of its kernels
    recomputes is still stored once per such user, so with several (q/k/v projections reading
    one norm) it is stored once instead."""
    return stored_uses(node, lambda user: table[user.target].kind if user.target in table else None) <= 1


def _rounded(value: Lazy) -> Lazy:
    """`value` rounded to its dtype where it is computed (it was kept in `value.computed`)."""
    inner = value.inner_fn

    def rounded(ops: Any, index: tuple[Expr, ...]) -> Any:
        return ops.to_dtype(inner(ops, index), value.dtype)

    return Lazy(value.dtype, value.size, rounded, value.origins)


def size_expr(node: fx.Node) -> Expr:
    """The sympy expression of a node computing a size (its meta["val"] is an int or SymInt)."""
    val = node.meta.get("val")
    if isinstance(val, bool) or not isinstance(val, (int, torch.SymInt)):
        raise LoweringError(f"expected an integer size, got {type(val).__name__}: {node_location(node)}")
    return to_expr(val)


# Ops whose FakeTensor is laid out otherwise than eager's result: their meta kernel is torch's
# reference decomposition (copysign's `where(signbit(b), ...)` follows `b`), while eager's
# TensorIterator kernel follows its operands' strides, the first one's before the others.
_FAKE_LAYOUT_DIFFERS = frozenset({torch.ops.aten.copysign.Tensor})


def correct_layout(node: fx.Node, corrected: dict[fx.Node, Any]) -> None:
    """Record in `corrected` the value `node` has in eager when its fake is laid out otherwise:
    an op of `_FAKE_LAYOUT_DIFFERS`, or a pointwise op of a corrected value (whose fake, made
    from the wrong layout, inherited it)."""
    val = node.meta.get("val")
    pointwise = isinstance(node.target, torch._ops.OpOverload) and torch.Tag.pointwise in node.target.tags
    reads_corrected = any(a in corrected for a in node.args if isinstance(a, fx.Node))
    if not isinstance(val, torch.Tensor) or not (node.target in _FAKE_LAYOUT_DIFFERS or
                                                 (pointwise and reads_corrected)):
        return
    operands = [corrected.get(a, a.meta.get("val")) for a in node.args if isinstance(a, fx.Node)]
    operands = [v for v in operands if isinstance(v, torch.Tensor)]
    if not operands:
        return
    # Broadcast operands take part expanded to the output's shape (stride 0 along the
    # broadcast dims), as TensorIterator (and torch's elementwise prims) order dims.
    operands = [v if tuple(v.shape) == tuple(val.shape) else v.expand(val.shape) for v in operands]
    stride = compute_elementwise_output_strides(*operands)
    if not same_exprs(to_exprs(stride), to_exprs(val.stride())):
        corrected[node] = val.as_strided(val.shape, stride)


def _symbolic_scalars(args: Any) -> Any:
    if isinstance(args, (tuple, list)):
        return type(args)(_symbolic_scalars(a) for a in args)
    if isinstance(args, torch.SymInt):
        return to_expr(args)
    return args


def _tensor_vals(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []


def _lower_outputs(ctx: LoweringContext, node: fx.Node, env: dict[fx.Node, Any], known: set[sympy.Symbol],
                   output_views: bool, layouts: dict[int, Any] | None = None) -> tuple[tuple[Any, ...], Any]:
    """(the output's values, flattened; their pytree spec when the output nests, else None).
    Each is laid out as eager lays it out, or, for an output eager returns as a view, is a view
    (`_output_view`; `known`: the symbols the inputs give at run time). Without `output_views`
    (outputs leave through an `autograd.Function`, where a view could not be modified in place)
    only views eager could not modify in place either are views: those whose elements overlap
    (an expand's stride 0), which no buffer of their own can lay out as eager's. `layouts`: by
    output position, the input (FakeTensor) an output not stored yet is laid out as (its write
    into that input, `input_stores.py`), when of the same sizes and dtype."""
    (result,) = node.args
    flat = result if isinstance(result, (tuple, list)) else (result,)
    spec = None
    if any(isinstance(item, (tuple, list)) for item in flat):  # (a, (b, c)): leaves, then rebuilt
        flat, spec = pytree.tree_flatten(result)
    outs = []
    realized: dict[fx.Node, StridedView] = {}  # an output (or viewed value) listed twice is computed once
    for position, item in enumerate(flat):
        if not isinstance(item, fx.Node):
            outs.append(item)
            continue
        value = _output_view(ctx, item, env, realized, known, overlapping_only=not output_views)
        if value is None:
            value = env[item]
        if isinstance(value, Lazy):
            if item not in realized:
                like = ctx.eager_values.get(item, item.meta.get("val"))  # eager's strides
                written = (layouts or {}).get(position)
                if _same_geometry(written, like):
                    like = written
                realized[item] = ctx.realize_in_memory_order(value, like)
            value = realized[item]
        outs.append(value)
    return tuple(outs), spec


def _same_geometry(written: Any, like: Any) -> bool:
    """Whether the input `written` can hold the value `like` (same dtype and sizes)."""
    return (isinstance(written, torch.Tensor) and isinstance(like, torch.Tensor) and written.dtype == like.dtype
            and same_exprs(to_exprs(written.shape), to_exprs(like.shape)))


def _output_view(ctx: LoweringContext, item: fx.Node, env: dict[fx.Node, Any], realized: dict[fx.Node, StridedView],
                 known: set[sympy.Symbol], overlapping_only: bool = False) -> StridedView | None:
    """The output `item`, a view whose lowering is an index function (`Lazy`), as eager's view
    of the value or graph input it views (its base); None where it is stored on its own: no such
    view, a layout eager sets otherwise than the fakes say (`correct_layout`), a fake that is no
    view of a tensor laid out as the base's (make_fx's real tracing mode), or a base not laid out
    as eager's. A base not yet
    stored is computed for the view only when no buffer of the output's own can have its
    strides (a stride of 0, gaps under dynamic shapes, overlap)."""
    base = view_base(item)
    if base is None or base in ctx.eager_values or item in ctx.eager_values or not isinstance(env[item], Lazy):
        return None
    view_val, base_val = item.meta.get("val"), base.meta.get("val")
    if not isinstance(view_val, torch.Tensor) or not isinstance(base_val, torch.Tensor) \
            or view_val.dtype != base_val.dtype or not views_like(view_val, base_val):
        return None
    size, stride, offset = view_geometry(view_val, base_val)
    if overlapping_only and not overlaps(size, stride):
        return None
    base_size, base_stride = to_exprs(base_val.shape), to_exprs(base_val.stride())
    if not free_symbols((*size, *stride, offset, *base_size, *base_stride)) <= known:
        return None  # a data-dependent geometry: no input gives it at run time
    base_value = realized.get(base, env[base])
    if isinstance(base_value, Lazy):
        dense = same_exprs(base_stride, contiguous_strides(base_size)) or eager_strides(base_val, base_size)
        if not dense or _storable(view_val, size, stride):
            return None
        base_value = realized[base] = ctx.realize_in_memory_order(base_value, base_val)
    if not isinstance(base_value, StridedView) \
            or not (same_exprs(base_value.size, base_size) and same_exprs(base_value.stride, base_stride)):
        return None
    if base.op == "call_function" and not any(base_value.buffer in step_names(step) for step in ctx.steps):
        return None  # an op passing a graph input through: eager's result is not the input's memory
    return StridedView(base_value.buffer, view_val.dtype, size, stride, base_value.offset + offset)


def _storable(val: torch.Tensor, size: tuple[Expr, ...], stride: tuple[Expr, ...]) -> bool:
    """Whether a buffer of its own can hold `val` with eager's strides (`_laid_out_like`)."""
    return same_exprs(stride, contiguous_strides(size)) or eager_strides(val, size) is not None


def _input_symbols(inputs: Sequence[GraphInput]) -> set[sympy.Symbol]:
    """The symbols the kernel graph reads off its inputs at run time (sizes, strides, SymInts)."""
    found: set[sympy.Symbol] = set()
    for graph_input in inputs:
        if graph_input.spec is not None:
            found |= free_symbols((*graph_input.spec.size, *graph_input.spec.stride))
        elif isinstance(graph_input.symbol, sympy.Symbol):
            found.add(graph_input.symbol)
    return found
