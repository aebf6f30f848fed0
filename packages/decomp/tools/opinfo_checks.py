"""The checks of the OpInfo sweep (opinfo_decomp.py runs them and reports): for one OpInfo,
trace each sample to an ATen graph, decompose it with kiln.decomp's tables, compare with
eager (forward and gradients), and test the loop-level property. See opinfo_decomp.py.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._ops import OpOverload
from torch.func import functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.decomp import LOOP_LEVEL_OPS, OpsetError, check_opset, core_aten, decompose, loop_level

DTYPES = (torch.float32, torch.float64)
PROPERTY_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.uint8)
TABLES: dict[str, Callable[[], Any]] = {"core_aten": core_aten, "loop_level": loop_level}

# (op name, dtype name or "*", "fwd"/"grad"/"*", table or "*") -> reason. Strict: an entry
# that matches no failing sample is itself reported as a failure.
XFAIL: dict[tuple[str, str, str, str], str] = {}

# Ops whose numerics are not compared (the property sweep still covers them).
NUMERICS_SKIP: dict[str, str] = {}

# Ops whose outputs are uninitialized memory: a graph holding one is compared on output
# dtypes and shapes only (its values are whatever the allocator returned).
UNINITIALIZED = frozenset(
    {
        torch.ops.aten.empty.memory_format,
        torch.ops.aten.empty_like.default,
        torch.ops.aten.new_empty.default,
        torch.ops.aten.new_empty_strided.default,
        torch.ops.aten.empty_strided.default,
        torch.ops.aten.empty_permuted.default,
    }
)


@dataclasses.dataclass
class OpResult:
    """What the sweep found for one OpInfo."""

    name: str
    samples: int = 0  # sample x dtype x fwd/grad x table combinations tried
    passed: int = 0
    failed: int = 0
    xfailed: int = 0
    not_covered: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    xfail_hits: set[tuple[str, str, str, str]] = dataclasses.field(default_factory=set)
    uncovered_reasons: Counter = dataclasses.field(default_factory=Counter)
    decomposed_ops: set[str] = dataclasses.field(default_factory=set)
    # property
    traced: int = 0
    untraced: int = 0
    reduced: int = 0
    leftover: Counter = dataclasses.field(default_factory=Counter)
    trace_errors: list[str] = dataclasses.field(default_factory=list)
    capped: bool = False  # some samples were left out (--max-samples)
    seconds: float = 0.0
    # ops of each forward sample's graph, by dtype and sample index (not reported)
    forward_ops: dict[str, dict[int, set[Any]]] = dataclasses.field(
        default_factory=dict, repr=False
    )

    @property
    def traceable(self) -> bool:
        return self.traced > 0

    @property
    def is_reduced(self) -> bool:
        return self.traced > 0 and self.reduced == self.traced


# --------------------------------------------------------------------------- samples


def op_name(opinfo: Any) -> str:
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


def _sample_function(opinfo: Any, sample: Any) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """(fn, tensors): fn(*tensors) calls the op on ``sample`` with ``tensors`` swapped in."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i] for i in positions]
    op = opinfo.op

    def fn(*values: torch.Tensor) -> Any:
        filled = list(leaves)
        for i, value in zip(positions, values):
            filled[i] = value
        inp, args, kwargs = pytree.tree_unflatten(filled, spec)
        return op(inp, *args, **kwargs)

    return fn, tensors


def _joint_function(
    fn: Callable[..., Any], wants_grad: Sequence[bool], process: Callable[[Any], Any]
) -> Callable[..., Any]:
    """fn's gradients w.r.t. the inputs marked in ``wants_grad``, given output cotangents."""
    n_inputs = len(wants_grad)

    def joint(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # fresh leaves inside the function: functionalize's wrappers drop requires_grad
        inputs = [
            t.detach().requires_grad_(True) if wants else t
            for t, wants in zip(values[:n_inputs], wants_grad)
        ]
        cotangents = values[n_inputs:]
        with torch.enable_grad():
            outs = _differentiable(process(fn(*inputs)))
        wrt = [t for t, wants in zip(inputs, wants_grad) if wants]
        grads = torch.autograd.grad(outs, wrt, cotangents, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    return joint


def _differentiable(out: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]


def _all_strided(tensors: Sequence[torch.Tensor]) -> bool:
    return all(t.layout == torch.strided for t in tensors)


def _clone(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


def _upcast(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for t in tensors:
        if t.dtype in (torch.float32, torch.float16, torch.bfloat16):
            t = t.detach().to(torch.float64).requires_grad_(t.requires_grad)
        out.append(t)
    return out


# --------------------------------------------------------------------------- comparison


def _outputs(value: Any) -> list[Any]:
    return [leaf for leaf in pytree.tree_leaves(value)]


def compare(actual: Any, expected: Any, reference: Any | None, values: bool = True) -> str | None:
    """None when ``actual`` matches ``expected`` (eager); else a one-line reason. With
    ``values`` False only the outputs' kinds, dtypes and shapes are compared."""
    got, want = _outputs(actual), _outputs(expected)
    refs = _outputs(reference) if reference is not None else [None] * len(want)
    if len(got) != len(want):
        return f"{len(got)} outputs, eager has {len(want)}"
    for i, (g, w, r) in enumerate(zip(got, want, refs)):
        problem = _compare_one(g, w, r, values)
        if problem:
            return f"output {i}: {problem}"
    return None


def _compare_one(got: Any, want: Any, ref: Any, values: bool = True) -> str | None:
    if not isinstance(want, torch.Tensor):
        if isinstance(got, torch.Tensor) or got != want and not (got != got and want != want):
            return f"got {got!r}, eager {want!r}"
        return None
    if not isinstance(got, torch.Tensor):
        return f"got {type(got).__name__}, eager a tensor"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{list(got.shape)}, eager {want.dtype}{list(want.shape)}"
    if not values:
        return None
    try:
        torch.testing.assert_close(got, want, equal_nan=True)
        return None
    except AssertionError as err:
        message = " ".join(str(err).split())[:200]
    if (
        isinstance(ref, torch.Tensor)
        and want.is_floating_point()
        and _near_reference(got, want, ref)
    ):
        return None
    return message


def _near_reference(got: torch.Tensor, want: torch.Tensor, ref: torch.Tensor) -> bool:
    """torch's test_decomp rule: the decomposition is no further from the float64
    reference than eager is (plus 1e-7), NaN/inf where the reference has them."""
    ref = ref.to(torch.float64)
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(got.double()) & finite, finite):
        return False
    if not finite.any():
        return True
    got_err = (got.double() - ref)[finite].abs().max()
    want_err = (want.double() - ref)[finite].abs().max()
    return bool(got_err <= want_err + 1e-7)


# --------------------------------------------------------------------------- one sample


def _trace(
    fn: Callable[..., Any], tensors: Sequence[torch.Tensor], functional: bool = True
) -> torch.fx.GraphModule:
    """An ATen graph of ``fn``; functional (as kiln's autograd_trace hands graphs to decomp)
    unless ``functional`` is False (joint graphs: functorch's functionalize cannot host
    ``requires_grad_``; backward formulas are functional ATen anyway)."""
    if functional:
        fn = functionalize(fn, remove="mutations")
    gm = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*tensors)
    if functional and _mutates_internally(gm):
        # some composite kernels (aten._pad_circular) run below functionalization when
        # traced whole; their primitive ops functionalize on a second pass, as in
        # autograd_trace.trace_inference
        again = functionalize(fx.Interpreter(gm).run, remove="mutations")
        gm = make_fx(again, tracing_mode="fake", _allow_non_fake_inputs=True)(*tensors)
    return gm


def _mutates_internally(gm: torch.fx.GraphModule) -> bool:
    """A mutating op other than a write-back (``copy_`` into a placeholder) is left."""
    return any(
        isinstance(n.target, OpOverload)
        and n.target._schema.is_mutable
        and not (n.target is torch.ops.aten.copy_.default and n.args[0].op == "placeholder")
        for n in gm.graph.nodes
    )


def _graph_ops(gm: torch.fx.GraphModule) -> set[OpOverload]:
    return {n.target for n in gm.graph.nodes if isinstance(n.target, OpOverload)}


def _is_random(ops: Iterable[OpOverload]) -> bool:
    return any(torch.Tag.nondeterministic_seeded in op.tags for op in ops)


def _run_graph(gm: torch.fx.GraphModule, tensors: Sequence[torch.Tensor]) -> Any:
    """An ATen graph computes its values (gradients included) explicitly: no autograd."""
    with torch.no_grad():
        return _run(gm, [t.detach().clone() for t in tensors])


def _run(fn: Callable[..., Any], tensors: Sequence[torch.Tensor]) -> Any:
    torch.manual_seed(0)
    return fn(*tensors)


def _xfail_key(result: OpResult, dtype: torch.dtype, kind: str, table: str) -> Any:
    for key in (
        (result.name, str(dtype), kind, table),
        (result.name, "*", kind, table),
        (result.name, str(dtype), "*", table),
        (result.name, str(dtype), kind, "*"),
        (result.name, "*", "*", table),
        (result.name, "*", kind, "*"),
        (result.name, "*", "*", "*"),
    ):
        if key in XFAIL:
            return key
    return None


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """What to check: numerics (forward, and gradients with ``grad``), the property, with
    which tables, on at most ``max_samples`` samples per dtype (None: all)."""

    numerics: bool = True
    grad: bool = True
    prop: bool = True
    tables: tuple[str, ...] = tuple(TABLES)
    max_samples: int | None = None


@functools.cache
def _table(name: str) -> Any:
    """The built-in table ``name``, built once per process (tables are immutable)."""
    return TABLES[name]()


def _check_sample(
    result: OpResult,
    gm: torch.fx.GraphModule,
    tensors: Sequence[torch.Tensor],
    eager: Callable[[], tuple[Any, Any]],
    label: tuple[torch.dtype, str, str],
    config: SweepConfig,
    skip_ops: set[OpOverload],
    decomposed: dict[str, torch.fx.GraphModule] | None = None,
) -> None:
    """Decompose ``gm`` with each table that applies (or take the graph ``decomposed``
    already holds for it) and compare with eager."""
    dtype, kind, where = label
    ops = _graph_ops(gm)
    values = not ops & UNINITIALIZED
    expected = reference = traced_problem = None
    for table_name in config.tables:
        table = _table(table_name)
        applied = {op for op in ops if op in table} - skip_ops
        result.samples += 1
        if not applied:
            result.not_covered += 1
            result.uncovered_reasons["no op of the table"] += 1
            continue
        if _is_random(ops):
            result.not_covered += 1
            result.uncovered_reasons["random op"] += 1
            continue
        if expected is None:
            try:
                expected, reference = eager()
            except Exception as err:  # the sample does not run in eager: not our concern
                result.samples -= 1
                result.uncovered_reasons[f"eager raised {type(err).__name__}"] += 1
                return
            traced_problem = compare(_run_graph(gm, tensors), expected, reference, values)
        if traced_problem is not None:  # make_fx itself differs from eager: not a decomposition
            result.not_covered += 1
            result.uncovered_reasons["traced graph differs from eager"] += 1
            continue
        result.decomposed_ops.update(str(op) for op in applied)
        try:
            out = (decomposed or {}).get(table_name) or decompose(gm, table)
            problem = compare(_run_graph(out, tensors), expected, reference, values)
        except Exception as err:
            problem = f"decompose/run raised {type(err).__name__}: {_short(err)}"
        _record(result, problem, (dtype, kind, table_name, where), applied)


def _short(err: BaseException, limit: int = 160) -> str:
    return " ".join(str(err).split())[:limit]


def _record(
    result: OpResult, problem: str | None, label: tuple[Any, str, str, str], applied: set[Any]
) -> None:
    if problem is None:
        result.passed += 1
        return
    dtype, kind, table_name, where = label
    key = _xfail_key(result, dtype, kind, table_name)
    if key is not None:
        result.xfailed += 1
        result.xfail_hits.add(key)
        return
    result.failed += 1
    ops = ",".join(sorted(str(op).removeprefix("aten.") for op in applied))
    result.failures.append(f"{dtype} {kind} {table_name} [{ops}] {where}: {problem}")


# --------------------------------------------------------------------------- one op


def _samples(
    result: OpResult, opinfo: Any, dtype: torch.dtype, requires_grad: bool, limit: int | None
) -> list[Any]:
    """The op's CPU samples for ``dtype``, the first ``limit`` of them (the others are
    counted as not covered)."""
    torch.manual_seed(0)  # sample values are random: seed them so runs are reproducible
    samples = list(opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad))
    if limit is not None and len(samples) > limit:
        result.uncovered_reasons["over --max-samples"] += len(samples) - limit
        result.capped = True
        samples = samples[:limit]
    return samples


def _forward(
    result: OpResult, opinfo: Any, dtype: torch.dtype, config: SweepConfig, prop: bool
) -> None:
    forward_ops = result.forward_ops.setdefault(str(dtype), {})
    for index, sample in enumerate(_samples(result, opinfo, dtype, False, config.max_samples)):
        fn, tensors = _sample_function(opinfo, sample)
        if not _all_strided(tensors):  # sparse layouts: kiln graphs are dense
            result.untraced += prop
            result.uncovered_reasons["sparse input"] += 1
            continue
        try:
            gm = _trace(fn, tensors)
        except Exception as err:
            if prop:
                result.untraced += 1
                result.trace_errors.append(f"{type(err).__name__}: {_short(err, 120)}")
            continue
        forward_ops[index] = _graph_ops(gm)
        decomposed = {"loop_level": _check_property(result, gm)} if prop else {}
        if config.numerics and dtype in DTYPES:

            def eager(fn=fn, tensors=tensors) -> tuple[Any, Any]:
                expected = _run(fn, _clone(tensors))
                reference = _run(fn, _upcast(tensors)) if dtype == torch.float32 else None
                return expected, reference

            label = (dtype, "fwd", f"sample {index}")
            _check_sample(result, gm, tensors, eager, label, config, set(), decomposed)


def _check_property(result: OpResult, gm: torch.fx.GraphModule) -> Any:
    """Count whether loop_level() takes ``gm`` to LOOP_LEVEL_OPS; return the decomposed
    graph (None when decompose raised)."""
    result.traced += 1
    try:
        out = decompose(gm, _table("loop_level"))
    except Exception as err:
        result.leftover[f"decompose raised {type(err).__name__}"] += 1
        return None
    try:
        check_opset(out, LOOP_LEVEL_OPS)
        result.reduced += 1
    except OpsetError as err:
        result.leftover.update({node.op for node in err.nodes})
    return out


def _joint_graph(
    opinfo: Any, sample: Any, forward_ops: set[Any] | None
) -> tuple[Any, Any, list[torch.Tensor], set[Any]] | None:
    """(joint fn, its graph, its inputs, the forward graph's ops), or None when the
    sample has nothing to differentiate or does not trace. ``forward_ops``: the ops of
    the same sample's forward graph, when already traced."""
    fn, tensors = _sample_function(opinfo, sample)
    if not _all_strided(tensors) or not any(t.requires_grad for t in tensors):
        return None
    process = sample.output_process_fn_grad or (lambda out: out)
    try:
        outs = _differentiable(process(fn(*_clone(tensors))))
        if not outs:
            return None
        torch.manual_seed(1)
        cotangents = [torch.randn_like(t).detach() for t in outs]
        joint = _joint_function(fn, [t.requires_grad for t in tensors], process)
        gm = _trace(joint, [*tensors, *cotangents], functional=False)
        if forward_ops is None:
            forward_ops = _graph_ops(_trace(fn, tensors))
    except Exception:
        return None
    return joint, gm, [*tensors, *cotangents], forward_ops


def _backward(result: OpResult, opinfo: Any, dtype: torch.dtype, config: SweepConfig) -> None:
    # the same seed gives the same samples as the forward pass: reuse its graphs' ops
    known = result.forward_ops.get(str(dtype), {})
    for index, sample in enumerate(_samples(result, opinfo, dtype, True, config.max_samples)):
        traced = _joint_graph(opinfo, sample, known.get(index))
        if traced is None:
            continue
        joint, gm, inputs, forward_ops = traced

        def eager(joint=joint, inputs=inputs) -> tuple[Any, Any]:
            expected = _run(joint, _clone(inputs))
            reference = _run(joint, _upcast(inputs)) if dtype == torch.float32 else None
            return expected, reference

        # only the decomposition of backward ops is new here: forward ops were checked above
        label = (dtype, "grad", f"sample {index}")
        _check_sample(result, gm, inputs, eager, label, config, forward_ops)


def sweep_op(opinfo: Any, config: SweepConfig = SweepConfig()) -> OpResult:
    """Run the sweep for one OpInfo. An unexpected error is recorded as a failure."""
    result = OpResult(op_name(opinfo))
    start = time.perf_counter()
    supported = opinfo.supported_dtypes("cpu")
    prop_dtype = next((d for d in PROPERTY_DTYPES if d in supported), None)
    numerics = config.numerics and result.name not in NUMERICS_SKIP
    config = dataclasses.replace(config, numerics=numerics)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for dtype in DTYPES:
                if dtype not in supported:
                    continue
                _forward(result, opinfo, dtype, config, config.prop and dtype == prop_dtype)
                if numerics and config.grad and opinfo.supports_autograd:
                    _backward(result, opinfo, dtype, config)
            if config.prop and prop_dtype is not None and prop_dtype not in DTYPES:
                _forward(result, opinfo, prop_dtype, config, True)
        except Exception as err:  # sample generation and the like
            result.failed += 1
            result.failures.append(f"sweep raised {type(err).__name__}: {_short(err)}")
    result.forward_ops = {}
    result.seconds = time.perf_counter() - start
    return result
