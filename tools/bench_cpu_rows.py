"""The wider CPU rows of `nox -s bench` (issue 12): reductions by layout and width, normalizations
at several row widths, a GELU MLP, a training step of a small MLP and an embedding's gradient.

Each row is `(name, fn, args)` like tools/workloads.py's rows; `training_rows` run with autograd
on (tools/bench.py times them outside `torch.no_grad`). Row sizes stay at 2-4 M elements so the
suite takes minutes on 2 cores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from workloads import layer_norm_rows, rmsnorm_rows, sum_first_dim, var_mean_rows

Row = tuple[str, Callable[..., Any], tuple[torch.Tensor, ...]]
NORM_WIDTHS = (1024, 4096, 16384)
NORM_ELEMENTS = 4 * 1024 * 1024


def sum_of_transposed(x: torch.Tensor) -> torch.Tensor:
    """Row sums of a transposed matrix: a reduction whose reduced dim is the outer (strided) one."""
    return x.t().sum(-1)


class GeluMLP(torch.nn.Module):
    """A transformer's feed-forward block: linear, GELU (erf), linear."""

    def __init__(self, width: int = 512, hidden: int = 2048) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(width, hidden)
        self.fc2 = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class MLPTrainingStep(torch.nn.Module):
    """Forward and backward of a 3-layer ReLU MLP with a mean-squared-error loss; returns the loss
    and the gradients (reset first, so each call computes them afresh)."""

    def __init__(self, width: int = 512, hidden: int = 1024) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
        self.mlp.zero_grad(set_to_none=True)
        loss = F.mse_loss(self.mlp(x), target)
        loss.backward()
        return (loss.detach(), *(p.grad for p in self.mlp.parameters()))


class EmbeddingTrainingStep(torch.nn.Module):
    """A token embedding's forward and backward (a language model's first layer): the weight's
    gradient is a zero fill and a scatter-add of the rows' gradients; returns it."""

    def __init__(self, vocab: int = 8192, width: int = 512) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, width)

    def forward(self, ids: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        self.embedding.zero_grad(set_to_none=True)
        (self.embedding(ids) * grad).sum().backward()
        return self.embedding.weight.grad


def inference_rows(device: str = "cpu") -> list[Row]:
    """Reductions over dim 0 and over a transposed input, layer norm, rmsnorm and var_mean at
    widths 1024, 4096 and 16384, and a GELU MLP."""
    torch.manual_seed(0)
    square = torch.randn(2048, 2048, device=device)
    rows: list[Row] = [
        ("sum(0) 2048x2048", sum_first_dim, (square,)),
        ("sum(x.t(), -1) 2048x2048", sum_of_transposed, (square,)),
    ]
    for width in NORM_WIDTHS:
        x = torch.randn(NORM_ELEMENTS // width, width, device=device)
        w, b = torch.randn(width, device=device), torch.randn(width, device=device)
        shape = f"{x.shape[0]}x{width}"
        rows += [(f"layer_norm {shape}", layer_norm_rows, (x, w, b)),
                 (f"rmsnorm {shape}", rmsnorm_rows, (x, w)),
                 (f"var_mean {shape}", var_mean_rows, (x,))]
    rows.append(("gelu_mlp 256x512x2048", GeluMLP().eval().to(device), (torch.randn(256, 512, device=device),)))
    return rows


def training_rows(device: str = "cpu") -> list[Row]:
    """Training steps (forward + backward) of a small MLP and of a token embedding; run with
    autograd on."""
    torch.manual_seed(0)
    batch, width = 256, 512
    step = MLPTrainingStep(width).to(device)
    x, target = torch.randn(batch, width, device=device), torch.randn(batch, width, device=device)
    embedding = EmbeddingTrainingStep().to(device)
    ids = torch.randint(0, 8192, (8, 256), device=device)
    return [(f"mlp train step {batch}x{width}x1024", step, (x, target)),
            ("embedding train step 8x256 of 8192x512", embedding, (ids, torch.randn(8, 256, 512, device=device)))]
