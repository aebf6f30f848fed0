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
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # opinfo_checks, beside this file

from opinfo_checks import (  # noqa: E402
    TABLES,
    XFAIL,
    OpResult,
    SweepConfig,
    compare,
    op_name,
    sweep_op,
)

__all__ = ["SweepConfig", "compare", "run_sweep", "strict_xfail_errors", "sweep_op"]


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
    config: SweepConfig | None = None,
    *,
    jobs: int = 1,
    progress: bool = False,
    timeout: float = 900.0,
) -> list[OpResult]:
    """Sweep the named op_db entries (all when None) on ``jobs`` processes; results in
    op_db order. With one job the sweep runs in this process."""
    from torch.testing._internal.common_methods_invocations import op_db

    config = config or SweepConfig()
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
        "capped_ops": sorted(r.name for r in results if r.capped),
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
    if s["capped_ops"]:
        lines.append(
            f"{len(s['capped_ops'])} ops ran only their first --max-samples samples: "
            + ", ".join(s["capped_ops"])
        )
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
    # The sweep is CPU-only: with a GPU visible, op_db adds CUDA samples (``to``) and the
    # forked workers cannot initialize CUDA.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
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
