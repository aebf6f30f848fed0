"""Workloads and timing shared by the demo and the benchmark (tools/demo.py, tools/bench.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


class GatedMLP(torch.nn.Module):
    """A small MLP block: linear, x*sigmoid(x)+tanh(x) gate, linear, softmax over features."""

    def __init__(self, width: int = 512, hidden: int = 1024) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(width, hidden)
        self.fc2 = torch.nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = h * torch.sigmoid(h) + torch.tanh(h)
        return torch.softmax(self.fc2(h), dim=-1)


def pointwise_chain(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x) + torch.tanh(x) * 0.5 - torch.relu(-x)


def softmax_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def row_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.sum(-1), x.amax(-1)


def workloads(device: str = "cpu") -> list[tuple[str, Callable[..., Any], tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    rows = 2048 if device == "cpu" else 16384
    big = torch.randn(rows, 1024, device=device)
    return [
        ("gated_mlp 256x512", GatedMLP().eval().to(device), (torch.randn(256, 512, device=device),)),
        (f"pointwise {rows}x1024", pointwise_chain, (big,)),
        (f"softmax {rows}x1024", softmax_rows, (big,)),
        (f"sum+amax {rows}x1024", row_stats, (big,)),
    ]


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn: Callable[[], Any], repeat: int = 30, warmup: int = 3, device: str = "cpu") -> float:
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def max_error(a: Any, b: Any) -> float:
    if isinstance(a, torch.Tensor):
        return float((a - b).abs().max()) if a.numel() else 0.0
    return max(max_error(x, y) for x, y in zip(a, b))


def compile_and_time(fn: Callable[..., Any], args: tuple, backend: Any) -> tuple[Callable[..., Any], float, Any]:
    """torch.compile `fn` with `backend`; returns (compiled, first-call seconds, first result)."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    start = time.perf_counter()
    result = compiled(*args)
    return compiled, time.perf_counter() - start, result


class CountingBackend:
    """Wraps a backend and counts its calls, so a run that silently fell back to eager shows."""

    def __init__(self, backend: Callable[..., Any]) -> None:
        self.backend = backend
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        self.calls += 1
        return self.backend(gm, example_inputs)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join([line, rule, *body])
