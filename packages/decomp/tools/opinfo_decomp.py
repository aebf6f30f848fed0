"""OpInfo-driven differential sweep of kiln.decomp's tables against eager PyTorch.

For every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` (CPU):

* numerics: each sample input (float32 and float64) is traced to an ATen graph with
  ``make_fx``; when the graph holds an op that ``core_aten()`` / ``loop_level()`` decomposes,
  ``decompose(gm, table)`` runs on the real inputs and is compared with eager, with torch's
  default tolerances (``torch.testing.assert_close``) or, in float32, torch's test_decomp
  rule: no further from a float64 eager reference than eager itself (+1e-7). Gradients
  likewise: ``torch.autograd.grad`` traced to a joint graph, compared when the table
  decomposes an op of the backward part.
* property: after ``decompose(gm, loop_level())`` every node is in ``LOOP_LEVEL_OPS``
  (pointwise, reductions, views, indexing, externs), for every sample of every op that
  traces (float32, or the first dtype the op supports).

Usage (from the repository root)::

    python packages/decomp/tools/opinfo_decomp.py            # all ops, both parts
    python packages/decomp/tools/opinfo_decomp.py --ops softmax,nn.functional.gelu -v
    python packages/decomp/tools/opinfo_decomp.py --jobs 8 --no-grad

Exit status 1 when a sample mismatches (not listed in XFAIL), when an XFAIL entry passes
(strict), or with ``--min-reduced`` when the property rate is below it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
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
    seconds: float = 0.0

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


def compare(actual: Any, expected: Any, reference: Any | None) -> str | None:
    """None when ``actual`` matches ``expected`` (eager); else a one-line reason."""
    got, want = _outputs(actual), _outputs(expected)
    refs = _outputs(reference) if reference is not None else [None] * len(want)
    if len(got) != len(want):
        return f"{len(got)} outputs, eager has {len(want)}"
    for i, (g, w, r) in enumerate(zip(got, want, refs)):
        problem = _compare_one(g, w, r)
        if problem:
            return f"output {i}: {problem}"
    return None


def _compare_one(got: Any, want: Any, ref: Any) -> str | None:
    if not isinstance(want, torch.Tensor):
        if isinstance(got, torch.Tensor) or got != want and not (got != got and want != want):
            return f"got {got!r}, eager {want!r}"
        return None
    if not isinstance(got, torch.Tensor):
        return f"got {type(got).__name__}, eager a tensor"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{list(got.shape)}, eager {want.dtype}{list(want.shape)}"
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
    return make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(*tensors)


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
            traced_problem = compare(_run_graph(gm, tensors), expected, reference)
        if traced_problem is not None:  # make_fx itself differs from eager: not a decomposition
            result.not_covered += 1
            result.uncovered_reasons["traced graph differs from eager"] += 1
            continue
        result.decomposed_ops.update(str(op) for op in applied)
        try:
            out = (decomposed or {}).get(table_name) or decompose(gm, table)
            problem = compare(_run_graph(out, tensors), expected, reference)
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


def _samples(opinfo: Any, dtype: torch.dtype, requires_grad: bool, limit: int | None) -> list[Any]:
    torch.manual_seed(0)  # sample values are random: seed them so runs are reproducible
    samples = opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad)
    return list(itertools.islice(samples, limit))


def _forward(
    result: OpResult, opinfo: Any, dtype: torch.dtype, config: SweepConfig, prop: bool
) -> None:
    for index, sample in enumerate(_samples(opinfo, dtype, False, config.max_samples)):
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


def _joint_graph(opinfo: Any, sample: Any) -> tuple[Any, Any, list[torch.Tensor], set[Any]] | None:
    """(joint fn, its graph, its inputs, the forward graph's ops), or None when the
    sample has nothing to differentiate or does not trace."""
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
        forward_ops = _graph_ops(_trace(fn, tensors))
    except Exception:
        return None
    return joint, gm, [*tensors, *cotangents], forward_ops


def _backward(result: OpResult, opinfo: Any, dtype: torch.dtype, config: SweepConfig) -> None:
    for index, sample in enumerate(_samples(opinfo, dtype, True, config.max_samples)):
        traced = _joint_graph(opinfo, sample)
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
    result.seconds = time.perf_counter() - start
    return result


# --------------------------------------------------------------------------- report


def _select(names: Sequence[str] | None) -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    if not names:
        return list(op_db)
    wanted = set(names)
    chosen = [o for o in op_db if op_name(o) in wanted]
    unknown = wanted - {op_name(o) for o in chosen}
    if unknown:
        raise SystemExit(f"unknown op_db names: {', '.join(sorted(unknown))}")
    return chosen


def _worker(conn: Any, config: SweepConfig) -> None:
    """Sweep each op_db index received on ``conn``; send back its OpResult."""
    from torch.testing._internal.common_methods_invocations import op_db

    torch.set_num_threads(1)
    while (index := conn.recv()) is not None:
        conn.send(sweep_op(op_db[index], config))


@dataclasses.dataclass
class _Slot:
    process: Any
    conn: Any
    index: int | None = None
    started: float = 0.0


class _Pool:
    """One op at a time per worker process, so that an op that kills its process (or runs
    past ``timeout`` seconds) is reported as that op's failure and the worker replaced."""

    def __init__(self, jobs: int, config: SweepConfig, timeout: float) -> None:
        self._context = multiprocessing.get_context("fork")
        self._config, self._timeout = config, timeout
        self._slots = [self._spawn() for _ in range(jobs)]

    def _spawn(self) -> _Slot:
        parent, child = self._context.Pipe()
        process = self._context.Process(target=_worker, args=(child, self._config), daemon=True)
        process.start()
        return _Slot(process, parent)

    def run(self, indices: Sequence[int], names: Sequence[str]) -> Iterable[OpResult]:
        todo = list(reversed(indices))
        busy = 0
        while todo or busy:
            for slot in self._slots:
                if slot.index is None and todo:
                    slot.index, slot.started = todo.pop(), time.monotonic()
                    slot.conn.send(slot.index)
                    busy += 1
            ready = multiprocessing.connection.wait(
                [s.conn for s in self._slots if s.index is not None], 1.0
            )
            for i, slot in enumerate(self._slots):
                if slot.index is None:
                    continue
                if slot.conn in ready:
                    try:
                        result = slot.conn.recv()
                    except EOFError:
                        result = None
                    if result is not None:
                        slot.index, busy = None, busy - 1
                        yield result
                        continue
                late = time.monotonic() - slot.started > self._timeout
                if slot.process.is_alive() and not late:
                    continue
                slot.process.kill()
                crashed = OpResult(names[slot.index], failed=1)
                reason = "timed out" if late else f"died (exit code {slot.process.exitcode})"
                crashed.failures.append(f"the sweep's worker process {reason} on this op")
                self._slots[i], busy = self._spawn(), busy - 1
                yield crashed

    def close(self) -> None:
        for slot in self._slots:
            if slot.process.is_alive():
                slot.conn.send(None)
                slot.process.join(timeout=5)
            if slot.process.is_alive():
                slot.process.kill()


def run_sweep(
    names: Sequence[str] | None = None,
    config: SweepConfig = SweepConfig(),
    *,
    jobs: int = 1,
    progress: bool = False,
    timeout: float = 900.0,
) -> list[OpResult]:
    """Sweep the named op_db entries (all when None) on ``jobs`` processes; results in
    op_db order. With one job the sweep runs in this process."""
    from torch.testing._internal.common_methods_invocations import op_db

    chosen = _select(names)
    indices = [i for i, o in enumerate(op_db) if any(o is c for c in chosen)]
    pool = _Pool(jobs, config, timeout) if jobs > 1 else None
    if pool is None:
        iterator: Iterable[OpResult] = (sweep_op(op_db[i], config) for i in indices)
    else:
        iterator = pool.run(indices, [op_name(o) for o in op_db])
    results: list[OpResult] = []
    try:
        for result in iterator:
            results.append(result)
            if progress:
                print(
                    f"[{len(results)}/{len(indices)}] {result.name} {result.seconds:.1f}s "
                    f"failed={result.failed}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if pool is not None:
            pool.close()
    order = {op_name(op_db[i]): k for k, i in enumerate(indices)}
    return sorted(results, key=lambda r: order[r.name])


def strict_xfail_errors(results: Sequence[OpResult]) -> list[str]:
    """XFAIL entries of swept ops that no failing sample matched (strict xfail)."""
    swept = {r.name for r in results}
    hit = set().union(*(r.xfail_hits for r in results)) if results else set()
    return [
        f"XFAIL {key} passed (remove the entry): {reason}"
        for key, reason in XFAIL.items()
        if key[0] in swept and key not in hit
    ]


def format_table(results: Sequence[OpResult], verbose: bool = False) -> str:
    header = f"{'op':<48} {'samples':>7} {'pass':>6} {'fail':>5} {'xfail':>5} {'n/c':>6}  opset"
    lines = [header, "-" * len(header)]
    for r in results:
        if not r.traceable:
            opset_col = "untraceable" if r.untraced else "no sample"
        elif r.is_reduced:
            opset_col = "loop-level"
        else:
            opset_col = "left: " + ", ".join(
                sorted(str(k).removeprefix("aten.") for k in r.leftover)
            )
        lines.append(
            f"{r.name:<48} {r.samples:>7} {r.passed:>6} {r.failed:>5} {r.xfailed:>5} "
            f"{r.not_covered:>6}  {opset_col}"
        )
        for failure in r.failures[: None if verbose else 3]:
            lines.append(f"    FAIL {failure}")
        if verbose and r.trace_errors:
            lines.append(f"    trace error: {r.trace_errors[0]}")
    return "\n".join(lines)


def summary(results: Sequence[OpResult]) -> dict[str, Any]:
    covered = [r for r in results if r.passed + r.failed + r.xfailed]
    traceable = [r for r in results if r.traceable]
    reduced = [r for r in traceable if r.is_reduced]
    return {
        "ops": len(results),
        "ops_covered": len(covered),
        "samples": sum(r.samples for r in results),
        "passed": sum(r.passed for r in results),
        "failed": sum(r.failed for r in results),
        "xfailed": sum(r.xfailed for r in results),
        "not_covered": sum(r.not_covered for r in results),
        "traceable_ops": len(traceable),
        "untraceable_ops": sorted(r.name for r in results if not r.traceable and r.untraced),
        "no_sample_ops": sorted(r.name for r in results if not r.traceable and not r.untraced),
        "reduced_ops": len(reduced),
        "reduced_pct": 100.0 * len(reduced) / max(len(traceable), 1),
        "not_reduced": {
            r.name: sorted(map(str, r.leftover)) for r in traceable if not r.is_reduced
        },
        "leftover_ops": Counter(str(k) for r in traceable for k in r.leftover),
    }


def format_summary(results: Sequence[OpResult]) -> str:
    s = summary(results)
    lines = [
        "",
        f"numerics: {s['ops']} ops ({s['ops_covered']} with a decomposition applied), "
        f"{s['samples']} samples, {s['passed']} passed, {s['failed']} failed, "
        f"{s['xfailed']} xfailed, {s['not_covered']} not covered",
        f"property: {s['reduced_ops']} of {s['traceable_ops']} traceable ops reduce to "
        f"LOOP_LEVEL_OPS ({s['reduced_pct']:.1f}%); {len(s['untraceable_ops'])} untraceable, "
        f"{len(s['no_sample_ops'])} without a (dense) CPU sample",
    ]
    if s["not_reduced"]:
        lines.append(
            "not reduced: "
            + "; ".join(f"{name} ({', '.join(ops)})" for name, ops in s["not_reduced"].items())
        )
    if s["untraceable_ops"]:
        lines.append("untraceable: " + ", ".join(s["untraceable_ops"]))
    if s["no_sample_ops"]:
        lines.append("no dense CPU sample: " + ", ".join(s["no_sample_ops"]))
    reasons = Counter()
    for r in results:
        reasons.update(r.uncovered_reasons)
    lines.append("not covered because: " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()))
    return "\n".join(lines)


def write_json(results: Sequence[OpResult], path: str) -> None:
    import json

    def plain(value: Any) -> Any:
        if isinstance(value, (set, frozenset)):
            return sorted(map(str, value))
        if isinstance(value, Counter):
            return {str(k): v for k, v in value.items()}
        return value

    rows = [{k: plain(v) for k, v in dataclasses.asdict(r).items()} for r in results]
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", help="comma-separated op_db names (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-grad", action="store_true", help="skip the gradient checks")
    parser.add_argument("--no-numerics", action="store_true", help="property sweep only")
    parser.add_argument("--no-property", action="store_true", help="numerics only")
    parser.add_argument(
        "--min-reduced",
        type=float,
        default=None,
        help="fail when fewer than this %% of traceable ops reduce",
    )
    parser.add_argument("--tables", help=f"comma-separated, of {', '.join(TABLES)} (default: all)")
    parser.add_argument(
        "--max-samples",
        type=int,
        default=None,
        help="at most this many samples per op and dtype (default: all)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds one op may take before it counts as failed (jobs > 1)",
    )
    parser.add_argument("--json", help="also write every op's result to this file")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    names = args.ops.split(",") if args.ops else None
    config = SweepConfig(
        numerics=not args.no_numerics,
        grad=not args.no_grad,
        prop=not args.no_property,
        tables=tuple(args.tables.split(",")) if args.tables else tuple(TABLES),
        max_samples=args.max_samples,
    )
    start = time.perf_counter()
    results = run_sweep(
        names, config, jobs=args.jobs, progress=not args.quiet, timeout=args.timeout
    )
    print(format_table(results, args.verbose))
    print(format_summary(results))
    if args.json:
        write_json(results, args.json)
    errors = strict_xfail_errors(results)
    for error in errors:
        print(error)
    print(f"({time.perf_counter() - start:.0f} s)")
    failed = any(r.failed for r in results) or errors
    s = summary(results)
    if args.min_reduced is not None and config.prop and s["reduced_pct"] < args.min_reduced:
        print(f"property below {args.min_reduced}%")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
