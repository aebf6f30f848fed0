"""Activation memory: bytes saved for backward under ``save_all`` vs ``min_cut``.

Each model goes through Dynamo (as in the kiln backend); every graph Dynamo hands over is
traced once with ``trace_joint`` and partitioned with both strategies. The table sums, over
the graphs, the tensors saved for backward: all saved storages, and those beyond the graph
inputs (parameters and the batch, alive anyway), which is the activation memory proper.

Usage (from the repository root)::

    PYTHONPATH=packages/autograd_trace/src .venv/bin/python \\
        packages/autograd_trace/tools/activation_memory.py

Exit status 1 if ``min_cut`` does not save strictly fewer bytes than ``save_all`` on the
transformer block.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

import torch
import torch._dynamo
import torch.fx

from kiln.autograd_trace import partition_joint, trace_joint

STRATEGIES = ("save_all", "min_cut")


class TransformerBlock(torch.nn.Module):
    """Pre-norm self-attention + GELU MLP, with dropout, written with plain tensor ops."""

    def __init__(self, dim: int = 256, heads: int = 8, hidden: int = 1024, dropout: float = 0.1):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
        attention = self.dropout(scores.softmax(-1)) @ v
        x = x + self.dropout(self.proj(attention.transpose(1, 2).reshape(batch, seq, dim)))
        hidden = torch.nn.functional.gelu(self.fc1(self.norm2(x)))
        return x + self.dropout(self.fc2(hidden))


@dataclasses.dataclass
class Measurement:
    model: str
    strategy: str
    graphs: int = 0
    saved_tensors: int = 0
    saved_bytes: int = 0
    activation_bytes: int = 0
    recomputed: int = 0


def measure(
    name: str, model: torch.nn.Module, run: Callable[[torch.nn.Module], object]
) -> list[Measurement]:
    """Partition every Dynamo graph of one training forward with both strategies."""
    results = {s: Measurement(name, s) for s in STRATEGIES}

    def backend(gm: torch.fx.GraphModule, example_inputs: list[object]):
        joint = trace_joint(gm, example_inputs)
        for strategy in STRATEGIES:
            partition = partition_joint(joint, strategy)
            result = results[strategy]
            result.graphs += 1
            result.saved_tensors += partition.num_saved_tensors
            result.saved_bytes += partition.saved_bytes
            result.activation_bytes += partition.activation_bytes
            result.recomputed += len(partition.recomputed)
        return gm

    torch._dynamo.reset()
    try:
        run(torch.compile(model, backend=backend))
    finally:
        torch._dynamo.reset()
    return list(results.values())


def transformer_block() -> list[Measurement]:
    torch.manual_seed(0)
    block = TransformerBlock()
    x = torch.randn(8, 128, 256)
    return measure(
        "transformer block (d=256, 8 heads, ffn 1024; batch 8 x 128)", block, lambda m: m(x)
    )


def hf_gpt2() -> list[Measurement]:
    try:
        import transformers
    except ImportError:
        print("transformers is not installed: skipping the Hugging Face model")
        return []
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_embd=256,
        n_layer=2,
        n_head=8,
        n_positions=128,
        vocab_size=1000,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 1000, (8, 128))
    return measure(
        "HF GPT2LMHeadModel (d=256, 2 layers; batch 8 x 128)",
        model,
        lambda m: m(ids, labels=ids).loss,
    )


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:8.2f} MiB"


def main() -> int:
    rows = transformer_block() + hf_gpt2()
    print(
        f"{'model':58} {'strategy':9} {'graphs':>6} {'tensors':>7} {'saved':>12} {'beyond inputs':>13} {'recomputed':>10}"
    )
    for r in rows:
        print(
            f"{r.model:58} {r.strategy:9} {r.graphs:6d} {r.saved_tensors:7d} {_mib(r.saved_bytes)} "
            f"{_mib(r.activation_bytes)} {r.recomputed:10d}"
        )
    block = {r.strategy: r for r in rows if r.model.startswith("transformer block")}
    ok = block["min_cut"].saved_bytes < block["save_all"].saved_bytes
    ratio = block["min_cut"].saved_bytes / block["save_all"].saved_bytes
    print(
        f"transformer block: min_cut saves {block['min_cut'].saved_bytes} B, save_all "
        f"{block['save_all'].saved_bytes} B: {ratio:.1%} ({'OK' if ok else 'NOT fewer'})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
