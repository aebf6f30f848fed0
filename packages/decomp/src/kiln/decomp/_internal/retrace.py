"""decompose(): retrace an ATen FX graph under fake tensors, applying a decomposition table.

How: an ``fx.Interpreter`` runs the graph under ``make_fx`` (proxy tracing) while a
``TableDispatchMode`` applies the table at the dispatcher (see dispatch_mode.py: that is
how CompositeImplicitAutograd ops listed in ``keep`` stay whole), inside ``fx.traceback.preserve_node_meta()`` so every
node a decomposition emits inherits the ``stack_trace`` (and module stack, ...) of the
node it came from. Tensor attributes (``get_attr``) are passed in as extra inputs, so the
fake mode never meets a real tensor and the attributes keep their names; the traced graph
is then copied into a graph with the original placeholders, attributes and codegen.

Values from several fake modes (a graph pieced together from several traces), and ops with
data-dependent output shapes in a graph traced without a ShapeEnv (``make_fx`` in real mode),
are retraced under a fresh fake mode with a ShapeEnv: such sizes become unbacked symbols.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._prims_common import suggest_memory_format
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_symbols
from torch.fx.passes.shape_prop import _extract_tensor_metadata
from torch.utils._python_dispatch import _pop_mode_temporarily

from .casts import fold_exact_casts
from .cleanup import eliminate_dead_pure_nodes
from .dispatch_mode import TableDispatchMode, below_autograd
from .inplace import functionalize_unobservable_inplace, unobservable_inplace_nodes
from .layouts import relayout_as_recorded, rolls_nothing

log = logging.getLogger(__name__)


def decompose(
    gm: fx.GraphModule,
    table: Mapping[Any, Any],
    example_inputs: Sequence[Any] | None = None,
) -> fx.GraphModule:
    """Return a new GraphModule computing what ``gm`` computes, with ``table`` applied.

    ``gm`` is an ATen-level graph (a Torch IR graph from Dynamo works too: it comes out
    as ATen). The placeholders' ``meta["val"]`` (Dynamo's ``meta["example_value"]``
    when there is no ``val``) are FakeTensors, sizes may be SymInts: they give the fake
    mode and the values to retrace with. When some are missing, ``example_inputs`` (one
    per placeholder) are used instead: fake tensors as they are, real tensors faked with
    static shapes.
    Decompositions apply recursively: an op a decomposition emits is decomposed in turn
    if ``table`` has it. ``table`` is any mapping ``OpOverload -> fn`` (a DecompTable).

    The result has the same placeholders (names, order) and the same output structure,
    ``meta["val"]`` on every node, and each decomposed node's ``stack_trace`` on the nodes
    it became. Casts come out as ``aten._to_copy`` and exact cast pairs are folded
    (casts.py). ``gm`` is not modified; tensor attributes are shared, not copied.
    """
    return _decompose(gm, table, example_inputs, retraces=2)


def _decompose(
    gm: fx.GraphModule,
    table: Mapping[Any, Any],
    example_inputs: Sequence[Any] | None,
    retraces: int,
    own_shape_env: bool = False,
) -> fx.GraphModule:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode, inputs = _fake_inputs(placeholders, example_inputs, own_shape_env)
    attr_targets, attr_values = _lifted_attributes(gm, fake_mode)
    symbolic = fake_mode.shape_env is not None and (own_shape_env or _any_symbolic(inputs))
    runner = _AttrLiftingInterpreter(gm, attr_targets, table)
    mode = TableDispatchMode(table, frozenset(getattr(table, "kept", ())))

    def run_under_table(*args: Any) -> Any:
        with below_autograd(), mode:
            return runner.run_flat(*args)

    try:
        with fx.traceback.preserve_node_meta():
            # the table is also make_fx's, for the bodies of higher-order ops (dispatch_mode.py)
            traced = make_fx(
                run_under_table,
                decomposition_table=table,
                tracing_mode="symbolic" if symbolic else "fake",
            )(*inputs, *attr_values)
    except (DynamicOutputShapeException, DataDependentOutputException):
        if own_shape_env or fake_mode.shape_env is not None:
            raise
        # an op with a data-dependent output shape (unique_consecutive, nonzero) in a graph
        # whose values came without a ShapeEnv (make_fx in real mode): retrace under a fake
        # mode with one, where such sizes become unbacked symbols
        return _decompose(gm, table, example_inputs, retraces, own_shape_env=True)
    result, converted = _rebuild(gm, traced, placeholders, attr_targets)
    if retraces and any(op in table for op in converted):
        # in-place ops the retrace's composite kernels made became out-of-place ops the
        # table decomposes (copy_ -> copy): one more retrace applies the table to them
        return _decompose(result, table, None, retraces - 1, own_shape_env)
    result, _ = fold_exact_casts(result)
    _keep_output_layouts(gm, result)
    log.debug(
        "decompose: %d nodes -> %d nodes (%s shapes)",
        len(gm.graph.nodes),
        len(result.graph.nodes),
        "symbolic" if symbolic else "static",
    )
    return result


def _keep_output_layouts(gm: fx.GraphModule, result: fx.GraphModule) -> None:
    """Give each output ``result`` computes the strides ``gm``'s output had: a decomposition may
    lay a value out otherwise than the op it replaces (eager's softmax of a channels-last
    tensor is contiguous, its decomposition's ``exp / sum`` channels-last), and an output's
    strides are the user's to observe. Views and inputs keep theirs (their strides are not
    chosen, they follow their base)."""
    before, after = _output_nodes(gm), _output_nodes(result)
    if len(before) != len(after):
        return
    from_differing = _computed_from_differing_layouts(gm)
    for old, new in zip(before, after):
        if not (isinstance(old, fx.Node) and isinstance(new, fx.Node)) or new.op != "call_function":
            continue
        if old in from_differing:
            continue
        old_val, new_val = _eager_layout_value(old), new.meta.get("val")
        if not (isinstance(old_val, torch.Tensor) and isinstance(new_val, torch.Tensor)):
            continue
        if getattr(new.target, "is_view", True) or old_val.dtype != new_val.dtype:
            continue
        same_shape = _exprs(old_val.shape) == _exprs(new_val.shape)
        if same_shape and _exprs(old_val.stride()) != _exprs(new_val.stride()):
            new.meta["val"] = old_val
            new.meta["tensor_meta"] = _extract_tensor_metadata(old_val)


# Ops whose meta kernel lays the output out otherwise than eager's kernels: eager's CPU roll
# writes into a tensor of the input's suggested memory format (channels-last stays
# channels-last; a transposed matrix gives a contiguous one), its meta kernel (and eager's CUDA
# kernel) returns a contiguous tensor.
_EAGER_KEEPS_INPUT_LAYOUT = frozenset({torch.ops.aten.roll.default})


def _computed_from_differing_layouts(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes computed from an op of `_EAGER_KEEPS_INPUT_LAYOUT` (not the op itself): their
    recorded fakes follow its meta kernel's layout (a pointwise op of a channels-last roll is
    contiguous there, channels-last in eager), so the retraced fakes are the better guess."""
    differing: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if any(arg in differing or arg.target in _EAGER_KEEPS_INPUT_LAYOUT for arg in node.all_input_nodes):
            differing.add(node)
    return differing


def _eager_layout_value(node: fx.Node) -> Any:
    """The node's recorded value, with the strides eager gives it where the meta kernel's differ
    (`_EAGER_KEEPS_INPUT_LAYOUT`: those of empty_like(input), unless a roll moves nothing)."""
    value = _recorded_value(node)
    if node.target not in _EAGER_KEEPS_INPUT_LAYOUT or not isinstance(value, FakeTensor) \
            or value.device.type != "cpu" or not _roll_dims(node):
        return value
    source = _recorded_value(node.args[0]) if isinstance(node.args[0], fx.Node) else None
    if not (isinstance(source, FakeTensor) and _exprs(source.shape) == _exprs(value.shape)) \
            or any(rolls_nothing(source.shape[d], shift) for shift, d in zip(node.args[1], _roll_dims(node))):
        return value
    with value.fake_mode:
        return torch.empty_like(source, dtype=value.dtype, memory_format=suggest_memory_format(source))


def _roll_dims(node: fx.Node) -> Any:
    """The dims a roll node rolls along (none: eager rolls the flattened tensor, contiguous)."""
    return node.args[2] if len(node.args) > 2 else node.kwargs.get("dims", ())


def _exprs(sizes: Sequence[Any]) -> tuple[Any, ...]:
    """Sizes or strides as ints and sympy expressions, compared without guarding on a SymInt."""
    return tuple(s.node.expr if isinstance(s, torch.SymInt) else s for s in sizes)


def _output_nodes(gm: fx.GraphModule) -> list[Any]:
    (result,) = gm.graph.output_node().args
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _fake_inputs(
    placeholders: list[fx.Node], example_inputs: Sequence[Any] | None, own_shape_env: bool = False
) -> tuple[FakeTensorMode, list[Any]]:
    """The fake mode to trace under and one fake value per placeholder: the values' own mode,
    or (values from several fake modes, or `own_shape_env`) a fresh mode with a ShapeEnv in
    which static-shaped values are made again."""
    recorded = [_recorded_value(n) for n in placeholders]
    if all(v is not _MISSING for v in recorded):
        values = recorded
    elif example_inputs is not None:
        values = list(example_inputs)
    else:
        missing = [n.name for n, v in zip(placeholders, recorded) if v is _MISSING]
        raise ValueError(
            f"decompose: placeholders {missing} have no meta['val'] and no example_inputs "
            "were given; pass example_inputs (real or fake tensors, one per placeholder)"
        )
    if len(values) != len(placeholders):
        raise ValueError(
            f"decompose: the graph has {len(placeholders)} placeholders but "
            f"{len(values)} example inputs were given"
        )
    try:
        fake_mode = detect_fake_mode(values) or FakeTensorMode()
    except AssertionError:  # values of different fake modes (a graph pieced from several traces)
        own_shape_env = True
    if own_shape_env:
        fake_mode = FakeTensorMode(shape_env=ShapeEnv())
        return fake_mode, [_refake(fake_mode, v, n) for v, n in zip(values, placeholders)]
    return fake_mode, [_to_fake(fake_mode, v) for v in values]


def _refake(fake_mode: FakeTensorMode, value: Any, node: fx.Node) -> Any:
    """``value`` as a tensor of ``fake_mode`` (same sizes, strides, dtype, device)."""
    if not isinstance(value, FakeTensor):
        return _to_fake(fake_mode, value)
    if value.fake_mode is fake_mode:
        return value
    if _any_symbolic([value]):
        raise ValueError(
            f"decompose: placeholder {node.name!r} has a symbolic-shaped value from another fake mode "
            "than the other placeholders; trace the graph under one fake mode"
        )
    with fake_mode:
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device,
                                   requires_grad=value.requires_grad)


_MISSING = object()


def _recorded_value(node: fx.Node) -> Any:
    """meta["val"] (ATen graphs), else meta["example_value"] (Dynamo's Torch IR graphs)."""
    if "val" in node.meta:
        return node.meta["val"]
    return node.meta.get("example_value", _MISSING)


def _to_fake(fake_mode: FakeTensorMode, value: Any) -> Any:
    if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
        return fake_mode.from_tensor(value, static_shapes=True)
    return value


def _any_symbolic(values: Sequence[Any]) -> bool:
    for value in values:
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(value, torch.Tensor) and free_symbols(value):
            return True
    return False


def _lifted_attributes(
    gm: fx.GraphModule, fake_mode: FakeTensorMode
) -> tuple[list[str], list[torch.Tensor]]:
    """Targets of tensor-valued get_attr nodes, and a fake value for each."""
    targets: list[str] = []
    values: list[torch.Tensor] = []
    for node in gm.graph.nodes:
        if node.op != "get_attr" or node.target in targets:
            continue
        attr = _fetch_attr(gm, node.target)
        if not isinstance(attr, torch.Tensor):
            continue
        val = node.meta.get("val")
        if not (isinstance(val, FakeTensor) and val.fake_mode is fake_mode):
            val = _to_fake(fake_mode, attr) if not isinstance(attr, FakeTensor) else attr
        targets.append(node.target)
        values.append(val)
    return targets, values


def _fetch_attr(module: torch.nn.Module, target: str) -> Any:
    obj: Any = module
    for i, atom in enumerate(target.split(".")):
        if not hasattr(obj, atom):
            path = ".".join(target.split(".")[:i])
            raise AttributeError(f"get_attr target {target!r}: no attribute {atom!r} in {path!r}")
        obj = getattr(obj, atom)
    return obj


_VIEWS_BY_SHAPE = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


_SCALAR_READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)


def _remember_scalar(node: fx.Node, tensor: Any) -> None:
    """Give ``tensor`` the symbolic value ``node`` (its ``.item()``) was traced with.

    Dynamo passes an unspecialized float (a module's ``scaling``, ``math.pi`` with
    ``dynamic=True``) as a 0-d tensor that the graph ``.item()``s, and its fake remembers the
    SymFloat (``item_memo``). A traced graph's placeholders hold detached copies of the fakes,
    which forget it; without it the retrace's ``.item()`` is data-dependent and fails.
    """
    recorded = node.meta.get("val")
    if not (isinstance(tensor, FakeTensor) and isinstance(recorded, (torch.SymInt, torch.SymFloat, torch.SymBool))):
        return
    if tensor.item_memo is None and recorded.node.shape_env is tensor.fake_mode.shape_env:
        tensor.item_memo = recorded


class _AttrLiftingInterpreter(fx.Interpreter):
    """Runs ``gm`` on flat arguments: its placeholders, then its tensor attributes.

    In-place ops whose mutation nobody observes run as their out-of-place op (inplace.py); a
    view whose input came out of the retrace laid out so that it cannot be viewed is a reshape.
    """

    def __init__(self, gm: fx.GraphModule, attr_targets: list[str], table: Mapping[Any, Any]) -> None:
        super().__init__(gm)
        self._attr_targets = attr_targets
        self._table = table
        self._recorded_layout_differs = _computed_from_differing_layouts(gm)
        self._attr_values: dict[str, Any] = {}
        self._functional = unobservable_inplace_nodes(gm.graph)
        self._node: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self._node = n
        return super().run_node(n)

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        target = self._functional.get(self._node, target)
        if target in _SCALAR_READS:
            _remember_scalar(self._node, args[0])
        if target not in _VIEWS_BY_SHAPE:
            return self._in_eager_layout(target, args, kwargs, super().call_function(target, args, kwargs))
        try:
            return super().call_function(target, args, kwargs)
        except (RuntimeError, ValueError) as error:
            if "view" not in str(error):
                raise
        # The graph's trace laid this view's input out so that it could be viewed; a
        # decomposition upstream gave it another layout (a norm of a channels-last tensor
        # keeps its strides): reshape copies where the view cannot, as eager's reshape does.
        log.debug("decompose: %s of a tensor laid out differently than traced: reshaped", self._node)
        return super().call_function(torch.ops.aten.reshape.default, args, kwargs)

    def _in_eager_layout(self, target: Any, args: Any, kwargs: Any, result: Any) -> Any:
        """A decomposed op's result in eager's layout (layouts.py): decompositions downstream
        read its strides (lerp's copy_strided, `*_like`). Eager's layout is the one its node
        recorded; for a node computed from a value whose recorded layout is not eager's (a
        channels-last `roll`), the op's meta function run on the retraced inputs, which have
        eager's layouts (a layer_norm of such a roll is contiguous, as eager's)."""
        node = self._node
        if node is None or target not in self._table or getattr(target, "is_view", True) \
                or target in _EAGER_KEEPS_INPUT_LAYOUT:
            return result
        if node not in self._recorded_layout_differs:
            return relayout_as_recorded(result, _recorded_value(node))
        # past this mode (no decomposition) and the proxy mode (nothing recorded): the fake
        # mode's meta function alone
        with _pop_mode_temporarily(), disable_proxy_modes_tracing():
            meta = target(*args, **kwargs)
        return relayout_as_recorded(result, meta)

    def run_flat(self, *args: Any) -> Any:
        split = len(args) - len(self._attr_targets)
        self._attr_values = dict(zip(self._attr_targets, args[split:]))
        try:
            return self.run(*args[:split], enable_io_processing=False)
        finally:
            self._attr_values = {}

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target in self._attr_values:
            return self._attr_values[target]
        return super().get_attr(target, args, kwargs)


def _rebuild(
    gm: fx.GraphModule,
    traced: fx.GraphModule,
    placeholders: list[fx.Node],
    attr_targets: list[str],
) -> fx.GraphModule:
    """Copy ``traced`` into a graph with ``gm``'s placeholders, attribute names and codegen."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    attrs: dict[str, Any] = {t: _fetch_attr(gm, t) for t in attr_targets}
    traced_inputs = [n for n in traced.graph.nodes if n.op == "placeholder"]
    user_inputs = traced_inputs[: len(placeholders)]
    attr_inputs = traced_inputs[len(placeholders) :]
    for original, new in zip(placeholders, user_inputs):
        env[new] = _copy_placeholder(graph, original, new)
    original_attr_meta = _get_attr_meta(gm)
    for target, new in zip(attr_targets, attr_inputs):
        node = graph.get_attr(target)
        node.meta = {**original_attr_meta.get(target, {}), **new.meta}
        env[new] = node
    renamed: dict[str, str] = {}  # attributes the retrace created -> name in the result
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            continue
        copied = graph.node_copy(node, lambda n: env[n])
        if node.op == "get_attr":
            if node.target not in renamed:
                renamed[node.target] = _fresh_attr_name(node.target, attrs)
                attrs[renamed[node.target]] = _fetch_attr(traced, node.target)
            copied.target = renamed[node.target]
        env[node] = copied
    graph.set_codegen(copy.copy(gm.graph._codegen))
    converted = functionalize_unobservable_inplace(graph)  # those composite kernels made
    eliminate_dead_pure_nodes(graph)
    graph.lint()
    result = fx.GraphModule(attrs, graph)
    result.meta.update(getattr(gm, "meta", {}))
    return result, converted


def _copy_placeholder(graph: fx.Graph, original: fx.Node, traced: fx.Node) -> fx.Node:
    default = original.args[0] if original.args else inspect.Signature.empty
    node = graph.placeholder(original.target, type_expr=original.type, default_value=default)
    node.meta = {**original.meta, **traced.meta}
    return node


def _get_attr_meta(gm: fx.GraphModule) -> dict[str, dict[str, Any]]:
    return {n.target: n.meta for n in gm.graph.nodes if n.op == "get_attr"}


def _fresh_attr_name(name: str, taken: Mapping[str, Any]) -> str:
    """``name``, or a numbered variant when the original graph already uses it."""
    if name not in taken:
        return name
    i = 0
    while f"{name}_kiln{i}" in taken:
        i += 1
    return f"{name}_kiln{i}"
