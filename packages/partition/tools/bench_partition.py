"""Benchmark kiln.partition against torch's partitioner and subgraph rewriter.

    python packages/partition/tools/bench_partition.py              # default sizes
    python packages/partition/tools/bench_partition.py --sizes 1000 4000 20000 100000 \
        --torch-max 4000 --patterns 20000 --rewriter-reference 4000

Partitioner: random DAGs of ATen pointwise ops (each node reads one or two of the 50
values before it; four inputs), a quarter of the nodes unsupported at random. kiln's
`partition` and torch's `CapabilityBasedPartitioner.partition_and_fuse` run on the same
graph with the same predicate. torch takes minutes beyond a few thousand nodes, so it only
runs up to `--torch-max` nodes. kiln's time is shown twice: `partition()` alone (code is
generated lazily) and "ready" (parent and every region's Python code generated, as torch's
result is); the ratio uses "ready".

Pattern matcher: a PatternSet of 50 ATen patterns (chains and trees of two or three ops)
over a random DAG: one walk to match, then one apply with replacements.

Rewriter reference: the same 50 patterns (each replaced by itself) applied by kiln's
`PatternSet.apply` and by `torch.fx.subgraph_rewriter.replace_pattern`, one pattern after
the other, on a `--rewriter-reference`-node graph.

Only torch and kiln-partition are needed. Times are wall-clock seconds, best of `--repeat`.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from kiln.partition import Pattern, PatternSet, Supported, partition

aten = torch.ops.aten
BINARY = (aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor)
UNARY = (aten.relu.default, aten.neg.default, aten.exp.default)


def random_dag(size: int, seed: int = 0, window: int = 50, inputs: int = 4) -> fx.GraphModule:
    """An ATen GraphModule of `size` pointwise nodes, each reading recent values."""
    rng = random.Random(seed)
    graph = fx.Graph()
    values = [graph.placeholder(f"x{i}") for i in range(inputs)]
    for _ in range(size):
        low = max(0, len(values) - window)
        if rng.random() < 0.5:
            pick = (values[rng.randrange(low, len(values))], values[rng.randrange(low, len(values))])
            values.append(graph.call_function(rng.choice(BINARY), pick))
        else:
            values.append(graph.call_function(rng.choice(UNARY), (values[rng.randrange(low, len(values))],)))
    used = {source for node in values for source in node.all_input_nodes}
    graph.output(tuple(v for v in values[inputs:] if v not in used))
    return fx.GraphModule(torch.nn.Module(), graph)


def unsupported_names(gm: fx.GraphModule, seed: int = 1, fraction: float = 0.25) -> frozenset[str]:
    rng = random.Random(seed)
    return frozenset(n.name for n in gm.graph.nodes if n.op == "call_function" and rng.random() < fraction)


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def materialize(gm: fx.GraphModule) -> None:
    """Generate the Python code of `gm` and of every GraphModule under it."""
    for module in gm.modules():
        if isinstance(module, fx.GraphModule) and hasattr(module, "real_recompile"):
            module.real_recompile()


def kiln_partition(gm: fx.GraphModule, refused: frozenset[str]) -> fx.GraphModule:
    return partition(gm, Supported(lambda n: n.name not in refused, "random 75%"))


def torch_partition(gm: fx.GraphModule, refused: frozenset[str]) -> fx.GraphModule:
    # torch's partitioner, as a reference only (kiln's package code never imports it).
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.operator_support import OperatorSupportBase

    class RandomSupport(OperatorSupportBase):
        def is_node_supported(self, submodules, node):  # noqa: ARG002 - torch's signature
            return node.op == "call_function" and node.name not in refused

    partitioner = CapabilityBasedPartitioner(gm, RandomSupport(), allows_single_node_partition=True)
    return partitioner.partition_and_fuse()


def bench_partitioner(sizes: list[int], torch_max: int, repeat: int) -> None:
    print("Partitioner: random DAG, 25% unsupported, best of", repeat)
    header = ("nodes", "kiln s", "kiln ready s", "regions", "torch s", "torch parts", "ratio")
    rows = []
    for size in sizes:
        gm = random_dag(size)
        refused = unsupported_names(gm)
        kiln_s, out = best_of(repeat, lambda: kiln_partition(gm, refused))  # noqa: B023
        ready_s, _ = best_of(repeat, lambda: materialize(kiln_partition(gm, refused)))  # noqa: B023
        report = out.meta["kiln_partition"]
        torch_s, torch_parts, ratio = "skipped", "-", "-"
        if size <= torch_max:
            seconds, fused = best_of(1, lambda: torch_partition(gm, refused))  # noqa: B023
            parts = sum(1 for n in fused.graph.nodes if n.op == "call_module")
            torch_s, torch_parts, ratio = f"{seconds:.2f}", str(parts), f"{seconds / ready_s:.0f}x"
        rows.append((size, f"{kiln_s:.3f}", f"{ready_s:.3f}", len(report.regions), torch_s, torch_parts, ratio))
        splits = ", ".join(f"{k} x{v}" for k, v in report.split_counts().items()) or "none"
        print(f"  {size} nodes: {len(report.regions)} regions, split by {splits}", flush=True)
    _table(header, rows)
    skipped = [s for s in sizes if s > torch_max]
    if skipped:
        print(f"  torch skipped above {torch_max} nodes (it takes minutes: ~100 s at 4,000 nodes).")


def chain_patterns() -> list[tuple[int, Callable[..., torch.Tensor]]]:
    """50 small (arity, pattern function) pairs over the ops of `random_dag`."""
    unary = (torch.relu, torch.neg, torch.exp)
    binary = (torch.add, torch.mul, torch.sub)

    def two(f, g):
        return lambda x: f(g(x))

    def three(f, g, h):
        return lambda x: f(g(h(x)))

    def left(b, u):
        return lambda x, y: b(u(x), y)

    def right(b, u):
        return lambda x, y: b(x, u(y))

    def after(b, u):
        return lambda x, y: u(b(x, y))

    def tree(b, c):
        return lambda x, y, z: b(c(x, y), z)

    fns = [(1, two(f, g)) for f, g in itertools.product(unary, unary)]
    for b, u in itertools.product(binary, unary):
        fns += [(2, left(b, u)), (2, right(b, u)), (2, after(b, u))]
    fns += [(3, tree(b, c)) for b, c in itertools.product(binary, binary)]
    fns += [(1, three(*ops)) for ops in list(itertools.product(unary, unary, unary))[:5]]
    return fns[:50]


def pattern_set(with_replacements: bool) -> PatternSet:
    patterns = PatternSet()
    for i, (arity, fn) in enumerate(chain_patterns()):
        pattern = Pattern(fn, [torch.randn(4) for _ in range(arity)], name=f"p{i}")
        patterns.add(pattern, fn if with_replacements else None)
    return patterns


def bench_patterns(size: int, repeat: int) -> None:
    print(f"\nPattern matcher: PatternSet of 50 ATen patterns over a {size}-node random DAG")
    gm = make_meta(random_dag(size, seed=3))
    patterns = pattern_set(with_replacements=False)
    match_s, found = best_of(repeat, lambda: patterns.match(gm))
    rewrite = pattern_set(with_replacements=True)
    apply_times = []
    for _ in range(repeat):
        fresh = make_meta(random_dag(size, seed=3))
        seconds, replaced = best_of(1, lambda: rewrite.apply(fresh))  # noqa: B023
        apply_times.append(seconds)
    rows = [
        ("match (one walk)", f"{match_s:.3f}", len(found)),
        ("apply (match + replace)", f"{min(apply_times):.3f}", len(replaced)),
    ]
    _table(("PatternSet of 50", "seconds", "matches"), rows)


def bench_rewriter_reference(size: int) -> None:
    """kiln's PatternSet.apply against torch.fx.subgraph_rewriter (one pattern at a time)."""
    print(f"\nReplacing with 50 patterns on a {size}-node graph: kiln vs torch's subgraph_rewriter")
    from torch.fx import subgraph_rewriter
    from torch.fx.experimental.proxy_tensor import make_fx

    rewrite = pattern_set(with_replacements=True)
    rewrite.apply(make_meta(random_dag(200, seed=3)))  # trace the replacements once
    gm = make_meta(random_dag(size, seed=3))
    kiln_s, done = best_of(1, lambda: rewrite.apply(gm))
    reference = random_dag(size, seed=3)
    graphs = [make_fx(fn)(*[torch.randn(4) for _ in range(arity)]) for arity, fn in chain_patterns()]
    torch_s, replaced = best_of(
        1, lambda: sum(len(subgraph_rewriter.replace_pattern(reference, g, g)) for g in graphs)
    )
    rows = [("kiln PatternSet.apply", f"{kiln_s:.3f}", len(done)),
            ("torch replace_pattern x50", f"{torch_s:.3f}", replaced)]
    _table(("rewriter", "seconds", "replaced"), rows)
    print(f"  ratio {torch_s / kiln_s:.0f}x (torch may count overlapping or escaping matches)")


def make_meta(gm: fx.GraphModule) -> fx.GraphModule:
    """Give every node a fake meta["val"] (replacements are traced on them)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode()
    inputs = [mode.from_tensor(torch.randn(4)) for n in gm.graph.nodes if n.op == "placeholder"]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*inputs)
    return gm


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    cells = [tuple(str(c) for c in row) for row in (header, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for index, row in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if index == 0:
            print("  " + "  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 20000, 100000])
    parser.add_argument("--torch-max", type=int, default=4000, help="largest size torch runs on")
    parser.add_argument("--patterns", type=int, default=20000, help="graph size for the matcher")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--rewriter-reference", type=int, default=4000,
        help="graph size for the comparison with torch's subgraph_rewriter (0: skip)",
    )
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}")
    bench_partitioner(args.sizes, args.torch_max, args.repeat)
    if args.patterns:
        bench_patterns(args.patterns, args.repeat)
    if args.rewriter_reference:
        bench_rewriter_reference(args.rewriter_reference)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
