"""``aot_compile``: compiled forward and backward graphs stitched into PyTorch autograd.

One call of the compiled function:

1. the lifted module tensors (parameters, buffers) are appended to the user inputs;
2. with grad mode on and some input requiring grad, a ``torch.autograd.Function`` runs the
   compiled forward and saves what the partition says; its backward compiles the backward
   graph on first use and runs it (outputs the loss never reached count as zero, and inputs
   reached only through them get None gradients, as in eager). Otherwise a forward-only graph
   runs and nothing is saved;
3. the new values of mutated inputs are copied into the real inputs (under autograd, so a
   mutated input that requires grad gets the right history), except those the compiled graph
   wrote itself (see ``INPUT_MUTATIONS``);
4. outputs that are inputs or views of inputs are rebuilt from the real inputs
   (``as_strided``), so they are real views, and the user's output structure is restored.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable, Sequence

import torch
import torch.fx
import torch.utils._pytree as pytree

from .analysis import FROM_FORWARD, FROM_INPUT, FROM_INPUT_VIEW, FROM_OUTPUT
from .joint import Decompositions, JointGraph, trace_joint
from .lifting import fetch_attr
from .meta import INPUT_MUTATIONS, INTERNAL_OUTPUTS, VAL, WRITTEN_ATTRIBUTE
from .partitioner import Partition, build_inference_graph, partition_joint
from .plan import RuntimePlan, TensorLayout, runtime_plan
from .symbols import bind_symbols, evaluate, has_symbols

log = logging.getLogger(__name__)

Compiler = Callable[[torch.fx.GraphModule, list[object]], Callable[..., Sequence[object]]]

# ``gm.meta[INPUT_MUTATIONS]`` of a forward graph offers its compiler the input mutations it may
# apply itself: ``((output position, input position), ...)``, each output the new value of that
# input, for inputs that do not require grad and that no other output aliases (nothing saved for
# the backward sees the input change early). A compiler that writes some of them into the inputs
# itself (as Inductor's ``keep_input_mutations``) returns a callable whose ``WRITTEN_ATTRIBUTE``
# (``inputs_written``) lists those output positions; the runtime then copies nothing for them.
Partitioner = str | Callable[[JointGraph], Partition]


def aot_compile(
    fn: Callable[..., object],
    example_inputs: Sequence[object],
    fw_compiler: Compiler,
    bw_compiler: Compiler | None = None,
    decompositions: Decompositions | None = None,
    partitioner: Partitioner = "save_all",
) -> AotCompiled:
    """Trace ``fn`` ahead of time into forward and backward graphs, compile them, and return
    a module that runs them under PyTorch autograd.

    ``fn``: a Torch-IR ``GraphModule`` (as Dynamo hands a backend), an ``nn.Module`` or a
    function of tensors. ``example_inputs``: one value per input (real or fake tensors,
    SymInts, ints); ``requires_grad`` on them and on parameters decides what is differentiated.
    ``fw_compiler`` / ``bw_compiler`` (default: ``fw_compiler``) take ``(gm, example_inputs)``
    with fake example inputs and return a callable taking the graph's inputs positionally and
    returning its output tuple; the backward is compiled on the first backward call, the
    forward-only graph (no-grad calls) on the first such call. ``partitioner`` is
    ``"save_all"``, ``"min_cut"`` or a callable ``JointGraph -> Partition`` (e.g.
    ``functools.partial(partition_joint, strategy="min_cut", memory_budget=...)``).

    The result is called like ``fn`` (user inputs only) and returns the same output structure.
    """
    joint = trace_joint(fn, example_inputs, decompositions)
    if isinstance(partitioner, str):
        partition = partition_joint(joint, partitioner)
    else:
        partition = partitioner(joint)
    return AotCompiled(fn, joint, partition, fw_compiler, bw_compiler or fw_compiler)


class AotCompiled(torch.nn.Module):
    """The callable ``aot_compile`` returns; ``joint`` and ``partition`` are kept for inspection
    (None in a module rebuilt by ``from_plan``), ``plan`` is what the runtime reads.

    It registers none of the traced module's parameters as its own: it reads them from the
    traced module on every call, so optimizer updates and replaced parameters are seen.
    """

    def __init__(
        self,
        fn: Callable[..., object],
        joint: JointGraph,
        partition: Partition,
        fw_compiler: Compiler,
        bw_compiler: Compiler,
    ) -> None:
        super().__init__()
        self.joint: JointGraph | None = joint
        self.partition: Partition | None = partition
        self.plan = runtime_plan(joint, partition)
        self._runtime = _Runtime(
            fn,
            self.plan,
            forward=_compile(fw_compiler, _annotate_forward(partition.fw_gm, self.plan, saves=True), "forward"),
            compile_backward=lambda: _compile(bw_compiler, partition.bw_gm, "backward"),
            compile_inference=lambda: _compile(
                fw_compiler, _annotate_forward(build_inference_graph(joint), self.plan, saves=False),
                "forward-only",
            ),
            backward_graph=partition.bw_gm,
            lifted_values=[entry.value for entry in joint.lifted],
        )

    @classmethod
    def from_plan(
        cls,
        fn: torch.nn.Module,
        plan: RuntimePlan,
        forward: Callable[..., Sequence[object]],
        compile_backward: Callable[[], Callable[..., Sequence[object]]],
        backward_graph: torch.fx.GraphModule,
    ) -> AotCompiled:
        """The module ``aot_compile`` made, rebuilt without tracing: from its ``plan``, its
        compiled ``forward``, a function returning its compiled backward (called on the first
        backward call) and the backward ATen graph (read for which tangents reach which
        gradient, and inlined by compiled autograd; no ``meta`` needed). ``fn`` is the traced
        module (or an equal one): lifted tensors are read from it by name. Calls that need no
        gradients run the compiled forward and keep its first outputs (no separate
        forward-only graph is compiled)."""
        self = cls.__new__(cls)
        torch.nn.Module.__init__(self)
        self.joint = None
        self.partition = None
        self.plan = plan
        self._runtime = _Runtime(
            fn,
            plan,
            forward=forward,
            compile_backward=compile_backward,
            compile_inference=lambda: _ForwardOutputsOnly(forward, plan.num_forward_outputs),
            backward_graph=backward_graph,
            lifted_values=None,
        )
        return self

    def forward(self, *args: object) -> object:
        return self._runtime(args)

    def __deepcopy__(self, memo: dict[int, object]) -> AotCompiled:
        """A copy reading the parameters of a deep copy of the traced module; the traced and
        compiled graphs (which hold fake tensors) are shared, as nothing changes them. Dynamo's
        accuracy minifier deep-copies the compiled module before each run."""
        clone = copy.copy(self)
        clone.__dict__ = dict(self.__dict__)
        fn = self._runtime.fn
        clone._runtime = copy.copy(self._runtime)
        clone._runtime.fn = copy.deepcopy(fn, memo) if isinstance(fn, torch.nn.Module) else fn
        return clone


class _ForwardOutputsOnly:
    """A training forward used for a call that needs no gradients: its first outputs."""

    def __init__(self, forward: Callable[..., Sequence[object]], num_outputs: int) -> None:
        self.forward = forward
        self.num_outputs = num_outputs

    def __call__(self, *args: object) -> Sequence[object]:
        return tuple(self.forward(*args))[: self.num_outputs]

    @property
    def inputs_written(self) -> tuple[int, ...]:
        return tuple(getattr(self.forward, WRITTEN_ATTRIBUTE, ()))


class _Runtime:
    def __init__(
        self,
        fn: Callable[..., object],
        plan: RuntimePlan,
        forward: Callable[..., Sequence[object]],
        compile_backward: Callable[[], Callable[..., Sequence[object]]],
        compile_inference: Callable[[], Callable[..., Sequence[object]]],
        backward_graph: torch.fx.GraphModule,
        lifted_values: Sequence[torch.Tensor] | None,
    ) -> None:
        self.fn = fn
        self.plan = plan
        self.forward = forward
        self._compile_backward = compile_backward
        self._compile_inference = compile_inference
        self.backward_graph = backward_graph
        self.lifted_values = lifted_values
        # made now, not on first use: Dynamo traces the backward that reads it (compiled autograd)
        self.traceable_backward = _views_as_reshapes(backward_graph)
        self.function = _make_function(self)
        # what `_check_inputs` compares on every call: (position, dtype, shape or None if symbolic)
        self._traced_inputs = tuple(
            (i, traced.dtype, None if has_symbols(traced.shape) else torch.Size(traced.shape))
            for i, traced in enumerate(plan.primal_layouts) if isinstance(traced, TensorLayout))

    @functools.cached_property
    def forward_written(self) -> frozenset[int]:
        """Positions of mutated inputs' new values the compiled forward wrote into the inputs."""
        return frozenset(getattr(self.forward, WRITTEN_ATTRIBUTE, ()))

    @functools.cached_property
    def copied_after_forward(self) -> tuple[int, ...]:
        """The mutated inputs (primal positions) the runtime copies into after the forward: the
        ones whose old value a saved tensor sharing their memory must keep (`_unshare_mutated`)."""
        return tuple(i for k, i in enumerate(self.plan.mutated_inputs) if k not in self.forward_written)

    @functools.cached_property
    def backward(self) -> Callable[..., Sequence[object]]:
        return self._compile_backward()

    @functools.cached_property
    def inference(self) -> Callable[..., Sequence[object]]:
        return self._compile_inference()

    def __call__(self, args: Sequence[object]) -> object:
        plan = self.plan
        if len(args) != plan.num_user_inputs:
            raise TypeError(
                f"kiln.autograd_trace: the compiled function takes {plan.num_user_inputs} inputs "
                f"({', '.join(i.name for i in plan.inputs[: plan.num_user_inputs])}), got {len(args)}"
            )
        flat = [*args, *self._lifted_values()]
        self._check_inputs(flat)
        if self._needs_autograd(flat):
            forward_values = self.function.apply(*flat)
            written = self.forward_written
        else:
            forward_values = tuple(self.inference(*flat))
            written = frozenset(getattr(self.inference, WRITTEN_ATTRIBUTE, ()))
        self._apply_mutations(flat, forward_values, written)
        outputs = self._user_outputs(flat, forward_values)
        return pytree.tree_unflatten(outputs, plan.out_spec)

    def _lifted_values(self) -> list[torch.Tensor]:
        if not isinstance(self.fn, torch.nn.Module):
            return list(self.lifted_values)
        return [fetch_attr(self.fn, name) for name in self.plan.lifted_names]

    def _check_inputs(self, flat: Sequence[object]) -> None:
        if len(flat) != len(self.plan.primal_layouts):
            raise AssertionError(f"expected {len(self.plan.primal_layouts)} inputs, got {len(flat)}")
        for i, dtype, shape in self._traced_inputs:
            value = flat[i]
            if not isinstance(value, torch.Tensor) or (value.dtype == dtype and (shape is None or value.shape == shape)):
                continue
            info, traced = self.plan.inputs[i], self.plan.primal_layouts[i]
            raise RuntimeError(
                f"kiln.autograd_trace: input {info.name!r} is {value.dtype}{list(value.shape)} but "
                f"was traced as {traced.dtype}{list(traced.shape)}; call aot_compile again for "
                "these inputs (or trace with dynamic shapes)"
            )

    def _needs_autograd(self, flat: Sequence[object]) -> bool:
        if not torch.is_grad_enabled() or self.plan.num_forward_outputs == 0:
            return False
        needs = False
        for value, info in zip(flat, self.plan.inputs, strict=True):
            if isinstance(value, torch.Tensor) and value.requires_grad:
                if not info.requires_grad:
                    raise RuntimeError(
                        f"kiln.autograd_trace: input {info.name!r} requires grad but did not when "
                        "the function was traced, so no gradient for it was traced; call "
                        "aot_compile again with example inputs that require grad"
                    )
                needs = True
        return needs

    def _apply_mutations(self, flat: Sequence[object], forward_values: Sequence[object],
                         written: frozenset[int]) -> None:
        for k, i in enumerate(self.plan.mutated_inputs):
            real, new = flat[i], forward_values[k]
            if real is new or k in written:
                continue
            if real.is_leaf and real.requires_grad:
                # Eager only allows this under no_grad (e.g. an EMA update in forward).
                with torch.no_grad():
                    real.copy_(new)
            else:
                real.copy_(new)

    def _user_outputs(
        self, flat: Sequence[object], forward_values: Sequence[object]
    ) -> list[object]:
        outputs: list[object] = []
        bindings = None
        for info in self.plan.outputs:
            if info.source == FROM_FORWARD:
                outputs.append(forward_values[info.index])
            elif info.source == FROM_INPUT:
                outputs.append(flat[info.index])
            elif info.source == FROM_OUTPUT:
                outputs.append(outputs[info.index])
            elif info.source == FROM_INPUT_VIEW and info.geometry is not None:
                start, rank = info.geometry
                geometry = [int(v) for v in forward_values[start : start + 2 * rank + 1]]
                outputs.append(
                    flat[info.index].as_strided(
                        geometry[:rank], geometry[rank : 2 * rank], geometry[-1]
                    )
                )
            elif info.source == FROM_INPUT_VIEW:
                size, stride, offset = info.view
                if bindings is None and has_symbols([*size, *stride, offset]):
                    bindings = bind_symbols(self.plan.primal_layouts, flat)
                concrete = [
                    [evaluate(v, bindings or {}) for v in part] for part in (size, stride, [offset])
                ]
                outputs.append(
                    flat[info.index].as_strided(concrete[0], concrete[1], concrete[2][0])
                )
            else:
                raise AssertionError(f"unknown output source {info.source!r}")
        return outputs


def _annotate_forward(gm: torch.fx.GraphModule, plan: RuntimePlan, saves: bool) -> torch.fx.GraphModule:
    """``gm`` (a forward: the mutated inputs' new values first; with ``saves``, what the backward
    reads after the user outputs) with ``meta[INPUT_MUTATIONS]``, the mutations its compiler may
    write itself (see ``INPUT_MUTATIONS``), and ``meta[INTERNAL_OUTPUTS]`` (see ``meta.py``)."""
    num_outputs = len(gm.graph.output_node().args[0])
    num_mutated = len(plan.mutated_inputs)
    saved = range(plan.num_forward_outputs, num_outputs) if saves else range(0)
    gm.meta[INTERNAL_OUTPUTS] = (*range(num_mutated), *saved)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outputs = list(gm.graph.output_node().args[0])
    offered = []
    for k, i in enumerate(plan.mutated_inputs):
        if plan.inputs[i].requires_grad or not _only_output_reads(outputs, k, placeholders[i]):
            continue
        offered.append((k, i))
    gm.meta[INPUT_MUTATIONS] = tuple(offered)
    return gm


def _only_output_reads(outputs: Sequence[object], position: int, placeholder: torch.fx.Node) -> bool:
    """Whether no output but the one at ``position`` is ``placeholder`` or may alias it."""
    value = placeholder.meta.get(VAL)
    if not isinstance(value, torch.Tensor):
        return False
    for k, out in enumerate(outputs):
        if k == position or not isinstance(out, torch.fx.Node):
            continue
        other = out.meta.get(VAL)
        if out is placeholder or other is None or (
                isinstance(other, torch.Tensor) and torch._C._is_alias_of(other, value)):
            return False
    return True


def _compile(
    compiler: Compiler, gm: torch.fx.GraphModule, what: str
) -> Callable[..., Sequence[object]]:
    example_inputs = [n.meta.get(VAL) for n in gm.graph.nodes if n.op == "placeholder"]
    log.debug("compiling the %s graph:\n%s", what, gm.code)
    compiled = compiler(gm, example_inputs)
    if not callable(compiled):
        raise TypeError(
            f"kiln.autograd_trace: the {what} compiler returned {type(compiled).__name__}, not a callable"
        )
    return compiled


def _make_function(runtime: _Runtime) -> type[torch.autograd.Function]:
    plan = runtime.plan
    num_forward = plan.num_forward_outputs
    num_saved = plan.num_saved_tensors
    differentiable = set(plan.tangent_outputs)

    class KilnCompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *flat):
            results = tuple(runtime.forward(*flat))
            outputs = results[:num_forward]
            copied = runtime.copied_after_forward
            saved = results[num_forward : num_forward + num_saved]
            if copied:
                saved = [_unshare_mutated(t, flat, copied) for t in saved]
            ctx.save_for_backward(*saved)
            ctx.kiln_sizes = results[num_forward + num_saved :]
            # Outputs the loss never reached get None, not zeros: the inputs only they lead to
            # keep None gradients, as in eager (an optimizer then leaves those parameters alone).
            ctx.set_materialize_grads(False)
            ctx.kiln_tangent_likes = [
                (o.shape, o.dtype, o.device) for o in (outputs[j] for j in plan.tangent_outputs)
            ]
            ctx.mark_non_differentiable(
                *(
                    o
                    for i, o in enumerate(outputs)
                    if i not in differentiable and isinstance(o, torch.Tensor)
                )
            )
            return outputs

        @staticmethod
        def backward(ctx, *grad_outputs):
            tangents = [grad_outputs[j] for j in plan.tangent_outputs]
            unreached = {k for k, t in enumerate(tangents) if t is None}
            tangents = [
                _dense(t) if t is not None else torch.zeros(shape, dtype=dtype, device=device)
                for t, (shape, dtype, device) in zip(tangents, ctx.kiln_tangent_likes, strict=True)
            ]
            create_graph = torch.is_grad_enabled()
            with torch.no_grad():
                grads = tuple(_backward_graph(runtime)(*ctx.saved_tensors, *ctx.kiln_sizes, *tangents))
            if create_graph:
                grads = _no_double_backward(grads)
            reaching = None
            if unreached and not torch.compiler.is_compiling():  # compiled autograd: zeros, as before
                reaching = _tangents_reaching_outputs(runtime.backward_graph, len(tangents))
            result: list[object] = [None] * plan.num_primals
            for k, (i, grad) in enumerate(zip(plan.grad_inputs, grads, strict=True)):
                if reaching is None or not reaching[k] or not reaching[k] <= unreached:
                    result[i] = grad
            return tuple(result)

    _not_a_dynamo_frame(KilnCompiledFunction.backward)
    return KilnCompiledFunction


def _not_a_dynamo_frame(fn: Callable[..., object]) -> None:
    """Dynamo never starts a frame of `fn` (nor of what it calls), as it never starts one of
    torch's own AOTAutograd runtime (skipped as a torch file): a ``loss.backward()`` that runs
    inside a ``torch.compile``'d function after a graph break calls the backward with Dynamo's
    frame hook set, and Dynamo would trace it, ATen graph included, into a graph of its own and
    compile it again. Inlined, it is still traced: compiled autograd's graph calls it and Dynamo
    inlines it (`_backward_graph`). Torch without the per-code frame strategy: left as is."""
    eval_frame = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    set_strategy = getattr(eval_frame, "set_code_exec_strategy", None)
    action, strategy = getattr(eval_frame, "_FrameAction", None), getattr(eval_frame, "_FrameExecStrategy", None)
    if set_strategy is None or action is None or strategy is None:
        log.debug("this torch has no per-code Dynamo frame strategy: the backward may be traced as a frame")
        return
    set_strategy(fn.__code__, strategy(action.SKIP, action.SKIP))


@functools.lru_cache(maxsize=64)
def _tangents_reaching_outputs(bw_gm: torch.fx.GraphModule, num_tangents: int) -> tuple[frozenset[int], ...]:
    """For each output of the backward graph, which tangents (its last ``num_tangents``
    placeholders, by position) it is computed from."""
    placeholders = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
    first_tangent = len(placeholders) - num_tangents
    reached: dict[torch.fx.Node, frozenset[int]] = {
        node: frozenset([index - first_tangent]) if index >= first_tangent else frozenset()
        for index, node in enumerate(placeholders)
    }
    for node in bw_gm.graph.nodes:
        if node.op != "placeholder":
            reached[node] = frozenset().union(*(reached[n] for n in node.all_input_nodes))
    values = bw_gm.graph.output_node().args[0]
    return tuple(
        reached[value] if isinstance(value, torch.fx.Node) else frozenset()
        for value in (values if isinstance(values, (tuple, list)) else (values,))
    )


def _backward_graph(runtime: _Runtime) -> Callable[..., Sequence[object]]:
    """The compiled backward, or the traced ATen backward graph while Dynamo traces this backward.

    Compiled autograd hands Dynamo the whole backward pass, this function's ``backward``
    included. Dynamo then inlines the ATen graph (views as reshapes), so its ops join the compiled-autograd graph
    (with DDP's gradient hooks and collectives) that the backend compiles as a whole; it never
    traces the backward compiler itself.
    """
    if torch.compiler.is_compiling():
        return runtime.traceable_backward
    return runtime.backward


def _views_as_reshapes(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with ``aten.view`` as ``aten.reshape``, for Dynamo to inline.

    The backward graph was traced with fake saved tensors whose strides are those of the
    forward's trace; the real ones come from the compiled forward (generated kernels, eager
    fallbacks) and may differ, so a view the trace allowed may need a copy. ``reshape`` is that
    view wherever the strides allow it.
    """
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    return torch.fx.GraphModule(gm, graph)


def _unshare_mutated(saved: object, flat: Sequence[object], mutated: Sequence[int]) -> object:
    """A saved value sharing memory with an input the runtime is about to overwrite is copied:
    the backward needs the value from before the mutation."""
    if isinstance(saved, torch.Tensor) and any(
        torch._C._is_alias_of(saved, flat[i]) for i in mutated
    ):
        return saved.clone()
    return saved


def _dense(grad: torch.Tensor) -> torch.Tensor:
    """The backward graph was traced with dense contiguous tangents; autograd may pass expanded
    or (behind a sparse output) sparse ones."""
    if not isinstance(grad, torch.Tensor):
        return grad
    if grad.layout != torch.strided:
        grad = grad.to_dense()
    return grad.contiguous()


class _DoubleBackwardError(torch.autograd.Function):
    """Passes gradients through; differentiating them again raises a clear error."""

    @staticmethod
    def forward(ctx, anchor, *grads):
        return tuple(g.detach() for g in grads)

    @staticmethod
    def backward(ctx, *unused):
        raise RuntimeError(
            "kiln.autograd_trace: double backward through an aot_compile'd function is not "
            "supported (its backward is a compiled graph, not differentiable again); compute "
            "higher-order gradients eagerly or with torch.func"
        )


def _no_double_backward(grads: Sequence[object]) -> tuple[object, ...]:
    positions = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
    if not positions:
        return tuple(grads)
    anchor = torch.zeros((), requires_grad=True)
    wrapped = _DoubleBackwardError.apply(anchor, *(grads[i] for i in positions))
    result = list(grads)
    for i, g in zip(positions, wrapped, strict=True):
        result[i] = g
    return tuple(result)
