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


def layer_norm_rows(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b)


def group_norm_rows(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Group norm of rows seen as (rows / 8, 8 channels, width) in 4 groups, with a weight and
    bias per channel: statistics over rows of 2 x width elements, normalization per channel."""
    return torch.nn.functional.group_norm(x.view(x.shape[0] // 8, 8, -1), 4, w, b).view(x.shape)


def group_norm_nchw(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.group_norm(x, 32, w, b)


def rmsnorm_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def var_mean_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.var_mean(x, -1)


def sum_first_dim(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


def row_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.sum(-1), x.amax(-1)


class ConvBlock(torch.nn.Module):
    """A small ConvNet block: 3x3 convolution (an ATen call in every backend), batch norm, ReLU;
    without the convolution (`conv=False`), the batch norm and ReLU alone (what a compiler
    generates code for)."""

    def __init__(self, channels: int = 64, conv: bool = True) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False) if conv else torch.nn.Identity()
        self.bn = torch.nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def channels_last_workloads(device: str = "cpu") -> list[tuple[str, Callable[..., Any], tuple[torch.Tensor, ...]]]:
    """The ConvNet block on a channels-last batch: batch norm in eval mode (running statistics)
    and in training mode (batch statistics over N, H, W: reductions along the outer dims of a
    tensor whose channels are contiguous; the forward pass, its running statistics updated)."""
    torch.manual_seed(0)
    batch, side = (16, 28) if device == "cpu" else (64, 56)
    image = torch.randn(batch, 64, side, side, device=device).contiguous(memory_format=torch.channels_last)
    shape = f"{batch}x64x{side}x{side}"

    def block(conv: bool, train: bool) -> torch.nn.Module:
        module = ConvBlock(64, conv).to(device).to(memory_format=torch.channels_last)
        return module.train(train)

    return [
        (f"conv+bn+relu channels-last {shape}", block(True, False), (image,)),
        (f"conv+bn(train)+relu channels-last {shape}", block(True, True), (image,)),
        (f"bn(train)+relu channels-last {shape}", block(False, True), (image,)),
    ]


def group_norm_workload(device: str = "cpu") -> tuple[str, Callable[..., Any], tuple[torch.Tensor, ...]]:
    """A diffusion UNet's GroupNorm(32, 128) with its affine map, on an NCHW batch."""
    batch, side = (8, 28) if device == "cpu" else (32, 64)
    image = torch.randn(batch, 128, side, side, device=device)
    w, b = torch.randn(128, device=device), torch.randn(128, device=device)
    return f"group_norm {batch}x128x{side}x{side}", group_norm_nchw, (image, w, b)


def workloads(device: str = "cpu") -> list[tuple[str, Callable[..., Any], tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    rows = 2048 if device == "cpu" else 16384
    big = torch.randn(rows, 1024, device=device)
    return [
        ("gated_mlp 256x512", GatedMLP().eval().to(device), (torch.randn(256, 512, device=device),)),
        (f"pointwise {rows}x1024", pointwise_chain, (big,)),
        (f"softmax {rows}x1024", softmax_rows, (big,)),
        (f"sum+amax {rows}x1024", row_stats, (big,)),
        group_norm_workload(device),
        *channels_last_workloads(device),
    ]


class LastHidden(torch.nn.Module):
    """A Hugging Face model returning only its last hidden state (a tensor, easy to compare)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).last_hidden_state


def model_workloads(device: str = "cpu") -> list[tuple[str, Callable[..., Any], tuple[torch.Tensor, ...]]]:
    """Hugging Face encoders/decoders built from configs (random weights, nothing downloaded)."""
    import transformers

    width, layers, heads = (256, 4, 4) if device == "cpu" else (768, 6, 12)
    batch, seq = (4, 128) if device == "cpu" else (8, 512)
    vocab = 8192
    configs = {
        "bert": transformers.BertConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                                        intermediate_size=4 * width, vocab_size=vocab),
        "gpt2": transformers.GPT2Config(n_embd=width, n_layer=layers, n_head=heads, vocab_size=vocab,
                                        bos_token_id=0, eos_token_id=0),
        "llama": transformers.LlamaConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                                          num_key_value_heads=heads // 2, intermediate_size=4 * width,
                                          vocab_size=vocab),
    }
    classes = {"bert": transformers.BertModel, "gpt2": transformers.GPT2Model, "llama": transformers.LlamaModel}
    result = []
    for family, config in configs.items():
        torch.manual_seed(0)
        model = LastHidden(classes[family](config)).eval().to(device)
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        result.append((f"{family} {layers}L d{width} {batch}x{seq}", model, (ids,)))
    return result


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn: Callable[[], Any], repeat: int = 30, warmup: int = 3, device: str = "cpu",
                   calls: int = 1) -> float:
    """Median seconds per call of `fn`; see `interleaved_medians` for `calls`."""
    return interleaved_medians({"fn": fn}, repeat, warmup, device, calls)["fn"]


def interleaved_medians(fns: dict[str, Callable[[], Any]], repeat: int = 30, warmup: int = 3,
                        device: str = "cpu", calls: int = 1) -> dict[str, float]:
    """Median seconds per call of each of `fns`, timed in turns (one sample of each, `repeat`
    turns), so that a host whose speed drifts (30% between blocks of a few seconds on the GPU
    machines' hosts) slows every backend alike.

    A sample is `calls` calls and one synchronization, divided by `calls`. With `calls=1` it is
    a call's wall time, host time included. A kernel of ~0.1 ms (a memory-bound row on an H100)
    is shorter than the host's time to call a compiled graph and wait for it, so for bandwidth
    figures use `calls` > 1: the host then enqueues the next calls while the GPU runs, and the
    sample measures the GPU."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    synchronize(device)
    samples: dict[str, list[float]] = {label: [] for label in fns}
    for _ in range(repeat):
        for label, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            synchronize(device)
            samples[label].append((time.perf_counter() - start) / calls)
    return {label: statistics.median(times) for label, times in samples.items()}


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
