"""``trace_joint``: one functional ATen graph computing forward outputs and input gradients.

Three steps, all on fake tensors:

1. ``analyze_forward``: an eager run that finds mutated inputs and output aliasing.
2. The autograd trace: ``make_fx`` of a function that runs the target with autograd on and
   calls ``torch.autograd.grad`` with tangent inputs, so the autograd engine itself writes the
   backward ops into the graph. In-place ops are still there (the engine needs real autograd
   semantics for them); mutated inputs that require grad are cloned first, as autograd forbids
   in-place ops on leaves.
3. Functionalization: ``make_fx(functionalize(...))`` re-runs that graph, removing every
   mutation. The write-backs into mutated inputs are dropped again: their new values are
   forward outputs, and the runtime copies them into the real inputs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from .analysis import ForwardAnalysis, InputInfo, OutputInfo, analyze_forward, view_geometry
from .errors import TraceError
from .fake_inputs import detach_fake, fake_mode_for, fakeify_inputs
from .joint_cleanup import clean_functional_joint
from .lifting import LiftedTensor
from .rewrites import DeclareHiddenMutations
from .targets import TraceTarget, make_target

log = logging.getLogger(__name__)

Decompositions = Mapping[torch._ops.OpOverload, Callable[..., object]]


@dataclasses.dataclass(frozen=True)
class JointSignature:
    """How a joint graph's inputs and outputs map to the user's (see ``JointGraph``): plain
    records, shared by the joint graph and the runtime's ``RuntimePlan``."""

    inputs: tuple[InputInfo, ...]
    outputs: tuple[OutputInfo, ...]
    out_spec: pytree.TreeSpec
    mutated_inputs: tuple[int, ...]
    num_forward_outputs: int
    tangent_outputs: tuple[int, ...]
    grad_inputs: tuple[int, ...]
    num_user_inputs: int

    @property
    def num_primals(self) -> int:
        return len(self.inputs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JointGraph(JointSignature):
    """A functional ATen joint forward+backward graph and what the runtime needs to run it.

    ``gm`` takes ``(*primals, *tangents)`` and returns ``(*forward_outputs, *grads)``:

    - primals: the user inputs, then the lifted module tensors (``lifted``); ``inputs[i]``
      describes primal ``i`` (requires grad, mutated, parameter name);
    - forward outputs: first the new values of the mutated inputs (``mutated_inputs``, in
      order), then the user outputs the graph computes (``outputs[k].source == "forward"``);
      user outputs that are inputs or views of inputs are rebuilt by the runtime instead;
    - tangents: one per forward output listed in ``tangent_outputs`` (those requiring grad);
    - grads: one per primal listed in ``grad_inputs`` (those requiring grad and reached).

    ``outputs`` and ``out_spec`` rebuild the user's output structure.
    """

    gm: torch.fx.GraphModule
    lifted: tuple[LiftedTensor, ...]
    fake_mode: FakeTensorMode = dataclasses.field(repr=False)

    @property
    def primals(self) -> list[torch.fx.Node]:
        return self._placeholders()[: self.num_primals]

    @property
    def tangents(self) -> list[torch.fx.Node]:
        return self._placeholders()[self.num_primals :]

    @property
    def forward_output_nodes(self) -> list[object]:
        return list(self._output_args()[: self.num_forward_outputs])

    @property
    def grad_nodes(self) -> list[object]:
        return list(self._output_args()[self.num_forward_outputs :])

    def _placeholders(self) -> list[torch.fx.Node]:
        return [n for n in self.gm.graph.nodes if n.op == "placeholder"]

    def _output_args(self) -> tuple[object, ...]:
        return tuple(self.gm.graph.output_node().args[0])

    def __str__(self) -> str:
        lines = [
            f"JointGraph: {self.num_primals} primals, {len(self.tangent_outputs)} tangents, "
            f"{self.num_forward_outputs} forward outputs, {len(self.grad_inputs)} grads",
            "  inputs: " + "; ".join(str(i) for i in self.inputs),
            "  outputs: " + "; ".join(str(o) for o in self.outputs),
        ]
        if self.mutated_inputs:
            names = [self.inputs[i].name for i in self.mutated_inputs]
            lines.append(f"  mutated inputs (first forward outputs): {names}")
        return "\n".join(lines)


def trace_joint(
    fn: Callable[..., object],
    example_inputs: Sequence[object],
    decompositions: Decompositions | None = None,
) -> JointGraph:
    """Trace ``fn`` to a functional ATen joint forward+backward graph.

    ``fn`` is a Torch-IR ``GraphModule`` (e.g. from Dynamo), an ``nn.Module`` or a plain
    function of tensors; its parameters, buffers and get_attr tensors become extra primals.
    ``example_inputs`` holds one value per input (real tensors, FakeTensors, SymInts, ints);
    no tensor data is read; ``requires_grad`` on them (and on parameters) decides which
    gradients the graph computes. Inside a Dynamo backend Dynamo's fake mode (and its symbolic
    sizes) is used. ``decompositions`` maps OpOverloads to decompositions applied while tracing
    (to forward and backward ops alike).

    Returns a ``JointGraph``; raises ``TraceError`` naming the failing node or input.
    """
    fake_mode, found = fake_mode_for(example_inputs)
    target = make_target(fn, len(example_inputs), fake_mode)
    placeholders = _input_stand_ins(target)
    fakes = fakeify_inputs(example_inputs, placeholders, fake_mode, static_shapes=not found)
    primals = _primal_leaves([*fakes, *(e.fake for e in target.lifted)], target, fake_mode)
    names = [*target.input_names, *(_attr_name(e) for e in target.lifted)]
    analysis = analyze_forward(target, primals, names, fake_mode)
    tangents = _tangent_fakes(analysis, fake_mode)
    traced = _trace_with_autograd(target, analysis, primals, tangents, fake_mode, decompositions)
    functional = _functionalize(traced, [*primals, *tangents], fake_mode, decompositions)
    grad_inputs = clean_functional_joint(
        functional,
        analysis,
        primal_names=names,
        primal_values=primals,
        num_tangents=len(tangents),
    )
    joint = JointGraph(
        gm=functional,
        inputs=analysis.inputs,
        outputs=analysis.outputs,
        out_spec=analysis.out_spec,
        mutated_inputs=analysis.mutated_inputs,
        num_forward_outputs=len(analysis.forward_requires_grad),
        tangent_outputs=_tangent_outputs(analysis),
        grad_inputs=grad_inputs,
        lifted=target.lifted,
        num_user_inputs=len(target.input_names),
        fake_mode=fake_mode,
    )
    log.debug("%s\n%s", joint, functional.code)
    return joint


def _input_stand_ins(target: TraceTarget) -> list[torch.fx.Node]:
    """Nodes to name inputs in fakeify errors (placeholders for graphs, dummies otherwise)."""
    graph = torch.fx.Graph()
    return [graph.placeholder(name) for name in target.input_names]


def _attr_name(entry: LiftedTensor) -> str:
    return entry.names[0].replace(".", "_")


def _primal_leaves(
    values: Sequence[object], target: TraceTarget, fake_mode: FakeTensorMode
) -> list[object]:
    """Fresh fake leaves requiring grad exactly where the real inputs/parameters do."""
    real_rg = [None] * len(target.input_names) + [e.value.requires_grad for e in target.lifted]
    leaves: list[object] = []
    with fake_mode:
        for value, lifted_rg in zip(values, real_rg, strict=True):
            if not isinstance(value, torch.Tensor):
                leaves.append(value)
                continue
            requires_grad = value.requires_grad if lifted_rg is None else lifted_rg
            if requires_grad and not (value.is_floating_point() or value.is_complex()):
                requires_grad = False
            leaves.append(detach_fake(value).requires_grad_(requires_grad))
    return leaves


def _tangent_outputs(analysis: ForwardAnalysis) -> tuple[int, ...]:
    return tuple(i for i, rg in enumerate(analysis.forward_requires_grad) if rg)


def _tangent_fakes(analysis: ForwardAnalysis, fake_mode: FakeTensorMode) -> list[torch.Tensor]:
    """Contiguous fake tangents shaped like the forward outputs that require grad."""
    with fake_mode:
        return [
            torch.empty(v.shape, dtype=v.dtype, device=v.device)
            for v, rg in zip(analysis.forward_examples, analysis.forward_requires_grad, strict=True)
            if rg
        ]


def _trace_with_autograd(
    target: TraceTarget,
    analysis: ForwardAnalysis,
    primals: Sequence[object],
    tangents: Sequence[torch.Tensor],
    fake_mode: FakeTensorMode,
    decompositions: Decompositions | None,
) -> torch.fx.GraphModule:
    num_primals, num_user = len(primals), len(target.input_names)
    wrt = [i for i, p in enumerate(primals) if isinstance(p, torch.Tensor) and p.requires_grad]

    def joint(*flat: object) -> tuple[object, ...]:
        leaves, cotangents = flat[:num_primals], list(flat[num_primals:])
        with torch.enable_grad(), DeclareHiddenMutations():
            work = [
                p.clone() if info.mutated and info.requires_grad else p
                for p, info in zip(leaves, analysis.inputs, strict=True)
            ]
            result = pytree.tree_flatten(target.call(work[:num_user], work[num_user:]))[0]
            forward = [work[i] for i in analysis.mutated_inputs]
            forward += [result[k] for k in analysis.forward_sources]
            forward += [g for k in analysis.geometry_sources for g in view_geometry(result[k])]
            grads = _input_grads(forward, analysis, [leaves[i] for i in wrt], cotangents)
        return (*forward, *grads)

    tracer = make_fx(joint, decomposition_table=dict(decompositions or {}), tracing_mode="real")
    return _run_tracer(tracer, [*primals, *tangents], fake_mode, grad=True, what="forward+backward")


def _input_grads(
    forward: Sequence[object],
    analysis: ForwardAnalysis,
    wrt: Sequence[torch.Tensor],
    cotangents: Sequence[torch.Tensor],
) -> list[torch.Tensor | None]:
    differentiable = [v for v, rg in zip(forward, analysis.forward_requires_grad) if rg]
    for value in differentiable:
        if not value.requires_grad:
            raise TraceError(
                "kiln.autograd_trace: an output required grad in the forward analysis but not "
                "while tracing the joint graph; the function is not deterministic in its "
                "autograd structure"
            )
    if not differentiable or not wrt:
        return [None] * len(wrt)
    with _eager_autograd_engine():
        return list(torch.autograd.grad(differentiable, wrt, cotangents, allow_unused=True))


def _eager_autograd_engine() -> contextlib.AbstractContextManager[None]:
    """The backward is traced by the ordinary autograd engine, even inside a compiled-autograd
    region (a forward compiled while ``compiled_autograd._enable`` is active): compiled
    autograd would capture the fake saved tensors of this trace as constants of its own graph."""
    compiled_autograd = getattr(torch._dynamo, "compiled_autograd", None)
    if compiled_autograd is None or not getattr(compiled_autograd, "compiled_autograd_enabled", False):
        return contextlib.nullcontext()
    return compiled_autograd._disable()


def _functionalize(
    traced: torch.fx.GraphModule,
    inputs: Sequence[object],
    fake_mode: FakeTensorMode,
    decompositions: Decompositions | None,
) -> torch.fx.GraphModule:
    def rerun(*flat: object) -> object:
        return torch.fx.Interpreter(traced).run(*flat)

    tracer = make_fx(
        functionalize(rerun, remove="mutations"),
        decomposition_table=dict(decompositions or {}),
        tracing_mode="real",
    )
    plain = [detach_fake(v) if isinstance(v, torch.Tensor) else v for v in inputs]
    return _run_tracer(tracer, plain, fake_mode, grad=False, what="functionalization")


def _run_tracer(
    tracer: Callable[..., torch.fx.GraphModule],
    inputs: Sequence[object],
    fake_mode: FakeTensorMode,
    *,
    grad: bool,
    what: str,
) -> torch.fx.GraphModule:
    try:
        with (
            fx_traceback.preserve_node_meta(),
            enable_python_dispatcher(),
            fake_mode,
            torch.set_grad_enabled(grad),
        ):
            return tracer(*inputs)
    except TraceError:
        raise
    except Exception as error:
        raise TraceError(
            f"kiln.autograd_trace: tracing the {what} graph failed: {type(error).__name__}: "
            f"{str(error).strip().splitlines()[0] if str(error).strip() else '(no message)'}\n"
            "  If an op has no FakeTensor/meta kernel, autograd formula or functionalization "
            "rule, register one with torch.library or pass a decomposition for it."
        ) from error
