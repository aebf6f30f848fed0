"""Two-process training runs over gloo for ``test_integration_distributed*.py``.

Each run spawns ``world_size`` processes (torch.multiprocessing, a FileStore rendezvous: no
torchrun, no network beyond localhost) and, in every rank, trains the same model twice from the
same initial weights: once uncompiled, once through kiln in the mode under test, three SGD steps
each. Every rank returns its losses, its final (full, unsharded) parameters and the reports of
the graphs kiln compiled, for the test to compare.

Modes:
- ``ddp``: ``torch.compile(DDP(model), backend=kiln)``, Dynamo's DDPOptimizer (one graph per
  bucket; kiln compiles each forward, and its backward on the first backward);
- ``fsdp2``: each block compiled, then sharded with ``fully_shard``; the root sharded last;
- ``python_reducer``: ``optimize_ddp="python_reducer"``: DDP's gradient all-reduces become
  post-accumulate-grad hooks that compiled autograd traces into the backward graph, which kiln
  compiles whole (with the collectives in it);
- ``compiled_autograd``: one process's worth of the same, without DDP (backward through kiln).

Run by hand: ``python integration/tests/distributed_runs.py ddp mlp``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from kiln.integration import GraphReport, KilnOptions
from kiln.integration._internal.backend import _compile

STEPS = 3
MODES = ("ddp", "fsdp2", "python_reducer", "compiled_autograd")
MODELS = ("mlp", "gpt2")


class Recording:
    """The kiln backend (``fallback=False``) keeping the report of every graph it compiled."""

    def __init__(self) -> None:
        self.options = KilnOptions.create({"fallback": False})
        self.reports: list[GraphReport] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> torch.nn.Module:
        return _compile(gm, example_inputs, self.options, self.reports.append)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class MLP(nn.Module):
    """Blocks with user-code forwards (Dynamo skips torch's own ``nn.Sequential`` frames)."""

    def __init__(self, width: int = 512, depth: int = 2) -> None:  # a 1 MB bucket per block
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def build(model: str) -> tuple[nn.Module, Callable[[nn.Module, int], torch.Tensor], Callable[[nn.Module], list]]:
    """The model (seeded, same on every rank), a loss of (model, step) and its blocks."""
    torch.manual_seed(0)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if model == "mlp":
        net = MLP()

        def mlp_loss(m: nn.Module, step: int) -> torch.Tensor:
            g = torch.Generator().manual_seed(100 * rank + step)
            x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
            return torch.nn.functional.mse_loss(m(x), y)

        return net, mlp_loss, lambda m: list(m.blocks)
    if model == "gpt2":
        net = _gpt2()

        def lm_loss(m: nn.Module, step: int) -> torch.Tensor:
            g = torch.Generator().manual_seed(100 * rank + step)
            ids = torch.randint(0, 64, (2, 8), generator=g)
            return m(input_ids=ids, labels=ids).loss

        return net, lm_loss, lambda m: list(m.transformer.h)
    raise ValueError(f"unknown model {model!r}; valid: {MODELS}")


def _full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    full = {}
    for name, p in model.named_parameters():
        value = p.full_tensor() if hasattr(p, "full_tensor") else p
        full[name.replace("_orig_mod.", "").removeprefix("module.")] = value.detach().clone()
    return full


def _train(model: nn.Module, loss_fn: Callable[[nn.Module, int], torch.Tensor],
           backward_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
           ) -> tuple[list[float], dict[str, torch.Tensor]]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        with backward_context():
            loss = loss_fn(model, step)
            loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, _full_parameters(model)


def _ddp(model: nn.Module) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    # DDPOptimizer splits the graph at each bucket (1 MB: the smallest it accepts, as large as
    # DDP's first bucket), so kiln compiles one graph per MLP block
    return DistributedDataParallel(model, bucket_cap_mb=1)


def run_ddp(model_name: str) -> dict[str, Any]:
    net, loss_fn, _ = build(model_name)
    reference = _train(_ddp(copy.deepcopy(net)), loss_fn)
    kiln = Recording()
    compiled = torch.compile(_ddp(net), backend=kiln)
    return _result(reference, _train(compiled, loss_fn), kiln)


def run_fsdp2(model_name: str) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    net, loss_fn, blocks = build(model_name)
    eager = copy.deepcopy(net)
    for block in blocks(eager):
        fully_shard(block)
    fully_shard(eager)
    reference = _train(eager, loss_fn)
    kiln = Recording()
    for block in blocks(net):
        block.compile(backend=kiln)
        fully_shard(block)
    fully_shard(net)
    return _result(reference, _train(net, loss_fn), kiln)


@contextlib.contextmanager
def _compiled_autograd(backend: Recording) -> Iterator[None]:
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend=backend)):
        yield


def run_python_reducer(model_name: str) -> dict[str, Any]:
    net, loss_fn, _ = build(model_name)
    reference = _train(_ddp(copy.deepcopy(net)), loss_fn)
    kiln = Recording()
    with torch._dynamo.config.patch(optimize_ddp="python_reducer"):
        compiled = torch.compile(_ddp(net), backend=kiln)
        trained = _train(compiled, loss_fn, lambda: _compiled_autograd(kiln))
    return _result(reference, trained, kiln)


def run_compiled_autograd(model_name: str) -> dict[str, Any]:
    net, loss_fn, _ = build(model_name)
    reference = _train(copy.deepcopy(net), loss_fn)
    kiln = Recording()
    compiled = torch.compile(net, backend=kiln)
    return _result(reference, _train(compiled, loss_fn, lambda: _compiled_autograd(kiln)), kiln)


RUNS = {"ddp": run_ddp, "fsdp2": run_fsdp2, "python_reducer": run_python_reducer,
        "compiled_autograd": run_compiled_autograd}


def _result(reference: tuple, compiled: tuple, kiln: Recording) -> dict[str, Any]:
    return {"reference_losses": reference[0], "reference_params": reference[1],
            "losses": compiled[0], "params": compiled[1],
            "reports": [_summary(r) for r in kiln.reports]}


def _summary(report: GraphReport) -> dict[str, Any]:
    """What the test checks of a GraphReport (GraphReports hold fusion records: not pickled)."""
    return {"compiled": report.compiled, "reason": report.reason, "kernels": report.kernels,
            "training": report.training, "backward": report.backward,
            "compiled_autograd": report.compiled_autograd, "collectives": report.collectives,
            "fallbacks": [str(f) for f in report.fallback_nodes], "text": str(report)}


def _worker(rank: int, world_size: int, directory: str, mode: str, model_name: str) -> None:
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(directory, "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        torch.save(RUNS[mode](model_name), os.path.join(directory, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def launch(mode: str, model_name: str, world_size: int = 2) -> list[dict[str, Any]]:
    """Run ``mode`` on ``model_name`` in ``world_size`` processes; one result per rank."""
    if mode not in RUNS:
        raise ValueError(f"unknown mode {mode!r}; valid: {MODES}")
    with tempfile.TemporaryDirectory(prefix="kiln_dist_") as directory:
        mp.spawn(_worker, args=(world_size, directory, mode, model_name), nprocs=world_size, join=True)
        return [torch.load(os.path.join(directory, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]


if __name__ == "__main__":
    for rank_result in launch(sys.argv[1], sys.argv[2]):
        print("losses", rank_result["losses"], "reference", rank_result["reference_losses"])
        for text in rank_result["reports"]:
            print(text["text"])
