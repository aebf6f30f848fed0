"""Coverage report (issue 20): which ATen ops become kiln kernels, declared externs or eager
fallbacks, over OpInfo samples (and optionally tiny HF models, forward and training).

For every OpInfo of op_db that traces on the CPU (float32, or the first dtype it supports; up
to --samples samples each), the sample is traced to a functional ATen graph (`make_fx`),
decomposed with `decomp.loop_level()` (what the backend does), and each ATen node is
classified by loopir's lowering table:

* **kernel**: loopir lowers it into a loop body (pointwise, reduction, scan, view, ...);
* **extern**: a library call: loopir's extern lowerings (mm, addmm, bmm) and the library-kernel
  groups decomp declares (`LIBRARY_GROUPS`: matmul, convolution, attention, sorting, linear
  algebra, FFT), which Inductor keeps as library calls too;
* **fallback**: loopir has no lowering: the backend runs it eagerly between regions.

``--models`` also compiles tiny HF BERT / GPT-2 / Llama / T5 / ViT (inference and one training
step) through `kiln.integration.explain` and counts lowered nodes against fallbacks.

Usage (from the repository root, with the packages importable)::

    python tools/coverage.py                 # OpInfo part, top fallback ops
    python tools/coverage.py --models        # plus the HF models
    python tools/coverage.py --ops cumsum,nn.functional.avg_pool2d -v
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import warnings
from typing import Any

import torch
from torch.func import functionalize
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten

from kiln import decomp, loopir

DTYPES = (torch.float32, torch.float64, torch.int64, torch.bool)
LIBRARY_GROUPS = ("matmul", "convolution", "attention", "linalg", "fft")
SORTS = ("sort", "topk", "kthvalue", "median", "nanmedian", "mode")


def library_ops() -> frozenset:
    from kiln.decomp._internal.opsets import EXTERN_OPS_BY_GROUP

    ops = frozenset().union(*(EXTERN_OPS_BY_GROUP[g] for g in LIBRARY_GROUPS))
    return ops | {op for op in EXTERN_OPS_BY_GROUP["sort_and_scan"] if op.overloadpacket.__name__ in SORTS}


def classify(gm: torch.fx.GraphModule, table: Any, library: frozenset) -> collections.Counter:
    """(category, op) counts of the ATen call nodes of `gm`."""
    counts: collections.Counter = collections.Counter()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target in table:
            kind = "extern" if table[node.target].kind == "extern" else "kernel"
        elif node.target in library:
            kind = "extern"
        else:
            kind = "fallback"
        counts[(kind, str(node.target))] += 1
    return counts


def _trace(opinfo: Any, sample: Any) -> torch.fx.GraphModule:
    args = (sample.input, *sample.args)
    flat, spec = tree_flatten((args, sample.kwargs))
    positions = [k for k, v in enumerate(flat) if isinstance(v, torch.Tensor)]

    def fn(*tensors: torch.Tensor) -> Any:
        values = list(flat)
        for k, t in zip(positions, tensors):
            values[k] = t
        (a, kw) = torch.utils._pytree.tree_unflatten(values, spec)
        return opinfo.op(*a, **kw)

    tensors = [flat[k] for k in positions]
    return make_fx(functionalize(fn, remove="mutations"), tracing_mode="fake", _allow_non_fake_inputs=True)(*tensors)


def opinfo_coverage(names: set[str] | None, samples: int, verbose: bool) -> tuple[collections.Counter, int, int]:
    from torch.testing._internal.common_methods_invocations import op_db

    table, library = loopir.default_lowerings(), library_ops()
    loop_level = decomp.loop_level()
    total: collections.Counter = collections.Counter()
    traced = skipped = 0
    for opinfo in op_db:
        name = opinfo.name + (f".{opinfo.variant_test_name}" if opinfo.variant_test_name else "")
        if names and name not in names and opinfo.name not in names:
            continue
        dtype = next((d for d in DTYPES if d in opinfo.supported_dtypes("cpu")), None)
        if dtype is None:
            skipped += 1
            continue
        ok = False
        try:
            for k, sample in enumerate(opinfo.sample_inputs("cpu", dtype)):
                if k >= samples:
                    break
                gm = decomp.decompose(_trace(opinfo, sample), loop_level)
                counts = classify(gm, table, library)
                total += counts
                ok = True
                if verbose:
                    print(f"{name}: {dict(counts)}")
        except Exception as exc:  # an op make_fx cannot trace: not counted (as the issue says)
            if verbose:
                print(f"{name}: does not trace ({type(exc).__name__}: {str(exc)[:100]})")
        traced += ok
        skipped += not ok
    return total, traced, skipped


def model_coverage() -> list[tuple[str, int, int, list[str]]]:
    import transformers

    from kiln.integration import explain

    tiny = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                attn_implementation="eager")
    configs = {
        "bert": (transformers.BertForMaskedLM, transformers.BertConfig(vocab_size=100, max_position_embeddings=64, **tiny)),
        "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2,
                                                                       n_positions=64, attn_implementation="eager")),
        "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig(vocab_size=100, max_position_embeddings=64,
                                                                          num_key_value_heads=2, **tiny)),
        "t5": (transformers.T5ForConditionalGeneration, transformers.T5Config(
            vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, attn_implementation="eager")),
    }
    rows = []
    for name, (cls, config) in configs.items():
        for mode in ("inference", "training"):
            torch.manual_seed(0)
            model = cls(config).train(mode == "training")
            ids = torch.randint(0, 100, (2, 16))
            extra = {"decoder_input_ids": ids} if name == "t5" else {}

            def fn(ids: torch.Tensor, model: Any = model, extra: dict = extra) -> torch.Tensor:
                return model(input_ids=ids, labels=ids, **extra).loss

            torch._dynamo.reset()
            if mode == "inference":
                with torch.no_grad():
                    report = explain(fn, ids)
            else:
                report = explain(fn, ids)
            rows.append((f"{name} {mode}", len(report.lowered_nodes), len(report.fallback_nodes),
                         sorted(collections.Counter(report.fallback_ops))))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", help="comma-separated OpInfo names (default: all)")
    parser.add_argument("--samples", type=int, default=3, help="samples per OpInfo (default 3)")
    parser.add_argument("--models", action="store_true", help="also the tiny HF models")
    parser.add_argument("--top", type=int, default=25, help="fallback ops to list")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    names = set(args.ops.split(",")) if args.ops else None
    total, traced, skipped = opinfo_coverage(names, args.samples, args.verbose)
    by_kind = collections.Counter()
    fallbacks = collections.Counter()
    for (kind, op), n in total.items():
        by_kind[kind] += n
        if kind == "fallback":
            fallbacks[op] += n
    nodes = sum(by_kind.values()) or 1
    print(f"OpInfo coverage ({traced} OpInfos traced, {skipped} not; up to {args.samples} samples each; "
          f"torch {torch.__version__}):")
    print("| ATen nodes after loop_level() | count | share |\n|---|---|---|")
    for kind in ("kernel", "extern", "fallback"):
        print(f"| {kind} | {by_kind[kind]} | {100 * by_kind[kind] / nodes:.1f}% |")
    print(f"kernels or externs: {100 * (by_kind['kernel'] + by_kind['extern']) / nodes:.1f}%")
    print(f"\ntop fallback ops: {', '.join(f'{op} ({n})' for op, n in fallbacks.most_common(args.top))}")
    if args.models:
        print("\n| model | ATen nodes lowered | eager fallbacks | fallback ops |\n|---|---|---|---|")
        for row, lowered, fell, ops in model_coverage():
            print(f"| {row} | {lowered} | {fell} | {', '.join(sorted(set(ops))) or '-'} |")
    print(f"\n({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
