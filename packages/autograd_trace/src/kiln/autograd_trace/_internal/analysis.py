"""The forward analysis: one eager run on fake tensors, before the joint is traced.

It answers what the joint trace must know up front: which inputs the function mutates
(an op whose schema writes an argument writes into their storage; version counters are not
enough: ``aten._native_batch_norm_legit`` writes running stats without bumping them), which outputs require grad (so get a tangent), and which
outputs are inputs, views of inputs, or the same tensor as an earlier output. Outputs that
alias inputs are not computed by the compiled graphs: the runtime rebuilds them from the real
inputs, so they stay real views with the right autograd history.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Sequence

import torch
import torch.utils._pytree as pytree
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from .errors import TraceError
from .fake_inputs import detach_fake
from .rewrites import DeclareHiddenMutations
from .targets import TraceTarget

log = logging.getLogger(__name__)

# Where a user output comes from at run time.
FROM_FORWARD = "forward"  # an output of the compiled forward graph
FROM_INPUT = "input"  # the input tensor itself
FROM_INPUT_VIEW = "input_view"  # a view of an input, rebuilt with as_strided
FROM_OUTPUT = "output"  # the same tensor as an earlier user output


@dataclasses.dataclass(frozen=True, slots=True)
class InputInfo:
    """One primal input of the joint graph."""

    name: str
    is_tensor: bool
    requires_grad: bool
    mutated: bool
    lifted_name: str | None = None  # qualified name when it is a module parameter/buffer

    def __str__(self) -> str:
        flags = [
            f for f, on in (("requires_grad", self.requires_grad), ("mutated", self.mutated)) if on
        ]
        where = f" = {self.lifted_name}" if self.lifted_name else ""
        return f"{self.name}{where} [{', '.join(flags) or 'plain'}]"


@dataclasses.dataclass(frozen=True, slots=True)
class OutputInfo:
    """One flattened user output: where the runtime takes it from.

    ``source`` is ``"forward"`` (``index`` into the forward graph's outputs), ``"input"`` or
    ``"input_view"`` (``index`` of the primal; ``view`` is ``(size, stride, storage_offset)``,
    entries may be SymInts; when they depend on data (``narrow`` at a tensor start), ``view``
    is None and ``geometry = (start, rank)`` says where in the forward graph's outputs the
    ``rank`` sizes, ``rank`` strides and the offset are) or ``"output"`` (``index`` of an earlier user output, same tensor).
    ``aliases`` lists earlier user outputs sharing storage with a forward output.
    """

    source: str
    index: int
    requires_grad: bool
    view: tuple[tuple[object, ...], tuple[object, ...], object] | None = None
    aliases: tuple[int, ...] = ()
    geometry: tuple[int, int] | None = None

    def __str__(self) -> str:
        alias = f" (shares storage with outputs {list(self.aliases)})" if self.aliases else ""
        grad = " requires_grad" if self.requires_grad else ""
        return f"{self.source}[{self.index}]{grad}{alias}"


@dataclasses.dataclass(frozen=True, slots=True)
class ForwardAnalysis:
    """What one fake eager run of the target says about its inputs and outputs."""

    inputs: tuple[InputInfo, ...]
    outputs: tuple[OutputInfo, ...]
    out_spec: pytree.TreeSpec
    forward_sources: tuple[int, ...]  # user-output index of each non-mutation forward output
    # user-output index of each data-dependent input view whose sizes, strides and offset
    # the forward graph returns (as ints, after the tensors)
    geometry_sources: tuple[int, ...]
    forward_requires_grad: tuple[bool, ...]  # per forward output (mutations first)
    forward_examples: tuple[object, ...]  # fake value of each forward output

    @property
    def mutated_inputs(self) -> tuple[int, ...]:
        return tuple(i for i, info in enumerate(self.inputs) if info.mutated)


def analyze_forward(
    target: TraceTarget,
    primals: Sequence[object],
    input_names: Sequence[str],
    fake_mode: FakeTensorMode,
) -> ForwardAnalysis:
    """Run ``target`` once on ``primals`` (fakes; leaves requiring grad where the real ones do)."""
    num_user = len(target.input_names)
    with fake_mode, torch.enable_grad():
        work = [_working_copy(p) for p in primals]
    before = [_layout(w) for w in work]
    recorder = WriteRecorder()
    with (
        fake_mode,
        enable_python_dispatcher(),
        torch.enable_grad(),
        DeclareHiddenMutations(),
        recorder,
        _discarding_unbacked_symbols(fake_mode),
    ):
        result = _call(target, work[:num_user], work[num_user:])
    flat, spec = pytree.tree_flatten(result)
    inputs = _input_infos(target, primals, input_names, work, before, recorder)
    _reject_aliased_mutated_inputs(inputs, primals)
    mutated = [i for i, info in enumerate(inputs) if info.mutated]
    outputs, forward_sources = _output_infos(flat, work, num_forward_offset=len(mutated))
    outputs, geometry_sources = _data_dependent_views(
        outputs, primals, num_forward=len(mutated) + len(forward_sources)
    )
    examples = [work[i] for i in mutated] + [flat[k] for k in forward_sources]
    examples += [g for k in geometry_sources for g in view_geometry(flat[k])]
    analysis = ForwardAnalysis(
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        out_spec=spec,
        forward_sources=tuple(forward_sources),
        geometry_sources=tuple(geometry_sources),
        forward_requires_grad=tuple(_requires_grad(v) for v in examples),
        forward_examples=tuple(examples),
    )
    log.debug(
        "forward analysis: inputs %s; outputs %s",
        [str(i) for i in inputs],
        [str(o) for o in outputs],
    )
    return analysis


def _discarding_unbacked_symbols(fake_mode: FakeTensorMode) -> contextlib.AbstractContextManager:
    """Data-dependent sizes (``.item()``, ``nonzero``) of this analysis run are not bound.

    The run has no tracer to record them; left pending, the later traces would find
    symbols that none of their graph nodes produce (``PendingUnbackedSymbolNotFound``).
    """
    shape_env = fake_mode.shape_env
    if shape_env is None:
        return contextlib.nullcontext()
    return shape_env.ignore_fresh_unbacked_symbols()


def _call(target: TraceTarget, inputs: Sequence[object], lifted: Sequence[object]) -> object:
    try:
        return target.call(inputs, lifted)
    except TraceError:
        raise
    except Exception as error:
        name = getattr(target.fn, "__qualname__", type(target.fn).__name__)
        first = str(error).strip().splitlines()[0] if str(error).strip() else "(no message)"
        raise TraceError(
            f"kiln.autograd_trace: running {name} on fake inputs failed: "
            f"{type(error).__name__}: {first}\n  If an op has no FakeTensor/meta kernel, register "
            "one with torch.library or pass a decomposition for it."
        ) from error


class WriteRecorder(TorchDispatchMode):
    """Records the storages that ops write into, as their schemas declare (``Tensor(a!)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: set[StorageWeakRef] = set()

    def wrote(self, value: object) -> bool:
        return isinstance(value, torch.Tensor) and _storage(value) in self.written

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for position, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[position] if position < len(args) else kwargs.get(argument.name)
            for tensor in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(tensor, torch.Tensor):
                    self.written.add(_storage(tensor))
        return func(*args, **kwargs)


def _storage(tensor: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(tensor.untyped_storage())


def _working_copy(primal: object) -> object:
    """The tensor the function runs on: the primal's storage and layout, its own autograd node.

    A detached alias, so an in-place op writing a value that requires grad leaves the primal
    untouched. For a leaf requiring grad the alias is made a non-leaf by copying the primal
    into it (same storage: no data moves): autograd forbids in-place ops on leaves requiring
    grad, the compiled function allows them on non-leaf inputs, and a clone would change the
    storage layout that ``as_strided`` outputs are measured against.
    """
    if not isinstance(primal, torch.Tensor):
        return primal
    alias = detach_fake(primal)
    if primal.requires_grad:
        alias.copy_(primal)
    return alias


def _layout(value: object) -> tuple[object, ...] | None:
    if not isinstance(value, torch.Tensor):
        return None
    return tuple(value.shape), tuple(value.stride()), value.storage_offset()


def _input_infos(
    target: TraceTarget,
    primals: Sequence[object],
    names: Sequence[str],
    work: Sequence[object],
    before: Sequence[tuple[object, ...] | None],
    recorder: WriteRecorder,
) -> list[InputInfo]:
    lifted_names = [None] * len(target.input_names) + [e.names[0] for e in target.lifted]
    infos = []
    for i, (primal, value, old) in enumerate(zip(primals, work, before, strict=True)):
        is_tensor = isinstance(primal, torch.Tensor)
        new = _layout(value)
        if is_tensor and old != new:
            raise TraceError(
                f"kiln.autograd_trace: input {names[i]!r} has its size/stride changed in place "
                f"(from {old} to {new}, e.g. by resize_, t_ or unsqueeze_); this is not "
                "supported: use the out-of-place op"
            )
        infos.append(
            InputInfo(
                name=names[i],
                is_tensor=is_tensor,
                requires_grad=bool(is_tensor and primal.requires_grad),
                mutated=recorder.wrote(value),
                lifted_name=lifted_names[i],
            )
        )
    return infos


def _reject_aliased_mutated_inputs(inputs: Sequence[InputInfo], primals: Sequence[object]) -> None:
    """Two inputs sharing memory where one is mutated: the graph would miss the other's change."""
    for i, info in enumerate(inputs):
        if not info.mutated:
            continue
        for j, other in enumerate(primals):
            if (
                j != i
                and isinstance(other, torch.Tensor)
                and torch._C._is_alias_of(other, primals[i])
            ):
                raise TraceError(
                    f"kiln.autograd_trace: input {info.name!r} is mutated and shares memory with "
                    f"input {inputs[j].name!r}; pass separate tensors (e.g. .clone() one of them)"
                )


def _output_infos(
    flat: Sequence[object], work: Sequence[object], num_forward_offset: int
) -> tuple[list[OutputInfo], list[int]]:
    outputs: list[OutputInfo] = []
    forward_sources: list[int] = []
    for k, value in enumerate(flat):
        info = _alias_of_input(value, work) or _same_as_output(value, flat[:k])
        if info is None:
            aliases = tuple(
                j
                for j in range(k)
                if isinstance(value, torch.Tensor)
                and isinstance(flat[j], torch.Tensor)
                and torch._C._is_alias_of(value, flat[j])
            )
            index = num_forward_offset + len(forward_sources)
            info = OutputInfo(FROM_FORWARD, index, _requires_grad(value), aliases=aliases)
            forward_sources.append(k)
        outputs.append(info)
    return outputs, forward_sources


def view_geometry(view: torch.Tensor) -> list[object]:
    """Sizes, strides and storage offset of a view, flat (``2 * rank + 1`` values)."""
    return [*view.shape, *view.stride(), view.storage_offset()]


def _data_dependent_views(
    outputs: list[OutputInfo], primals: Sequence[object], num_forward: int
) -> tuple[list[OutputInfo], list[int]]:
    """Input views whose geometry no input size determines get it from the forward graph."""
    bound = _input_symbols(primals)
    result: list[OutputInfo] = []
    geometry_sources: list[int] = []
    for k, info in enumerate(outputs):
        if info.source == FROM_INPUT_VIEW and not _free_symbols(info.view) <= bound:
            rank = len(info.view[0])
            start = num_forward + sum(2 * len(outputs[j].view[0]) + 1 for j in geometry_sources)
            info = dataclasses.replace(info, view=None, geometry=(start, rank))
            geometry_sources.append(k)
        result.append(info)
    return result, geometry_sources


def _free_symbols(values: object) -> set[object]:
    found: set[object] = set()
    for value in pytree.tree_leaves(values):
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            found |= value.node.expr.free_symbols
    return found


def _input_symbols(primals: Sequence[object]) -> set[object]:
    """The symbols the runtime can bind from the inputs (plain symbols of their geometry)."""
    found: set[object] = set()
    for value in primals:
        parts = _layout(value) if isinstance(value, torch.Tensor) else (value,)
        for leaf in pytree.tree_leaves(parts):
            if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                expr = leaf.node.expr
                if getattr(expr, "is_Symbol", False):
                    found.add(expr)
    return found


def _alias_of_input(value: object, work: Sequence[object]) -> OutputInfo | None:
    if not isinstance(value, torch.Tensor):
        return None
    for i, candidate in enumerate(work):
        if value is candidate:
            return OutputInfo(FROM_INPUT, i, _requires_grad(value))
    for i, candidate in enumerate(work):
        if (
            isinstance(candidate, torch.Tensor)
            and torch._C._is_alias_of(value, candidate)
            and value.dtype == candidate.dtype
        ):
            view = (tuple(value.shape), tuple(value.stride()), value.storage_offset())
            return OutputInfo(FROM_INPUT_VIEW, i, _requires_grad(value), view=view)
    return None


def _same_as_output(value: object, earlier: Sequence[object]) -> OutputInfo | None:
    if not isinstance(value, torch.Tensor):
        return None
    for j, other in enumerate(earlier):
        if value is other:
            return OutputInfo(FROM_OUTPUT, j, _requires_grad(value))
    return None


def _requires_grad(value: object) -> bool:
    return isinstance(value, torch.Tensor) and bool(value.requires_grad)
