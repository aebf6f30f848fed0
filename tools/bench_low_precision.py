"""`nox -s bench_low_precision`: bfloat16 on a GPU, eager vs Inductor vs kiln in one run.

    python tools/bench_low_precision.py [--suite rows models train] [--out results.md]

* rows: gelu, rmsnorm, layer norm and softmax over 4096-wide rows (and 1024/16384 for
  softmax), each with its bytes moved over the measured device-to-device copy bandwidth (GPU
  time: `ROW_CALLS` calls per timed sample, so the host's call time overlaps the kernels), and
  kiln's fallback count (an `explain` with the same options);
* models: Hugging Face BERT, GPT-2 and Llama (6 layers, d768, 8x512) in bfloat16 inference;
  every row's eager, Inductor and kiln calls timed in turns (`workloads.interleaved_medians`);
* train: an autocast-bf16 BERT training step (forward, backward), losses compared with eager;
  the three backends' steps timed in turns too.

Every number comes from this run; ratios > 1 mean kiln is faster.
"""

from __future__ import annotations

import argparse
import copy
import functools
import sys
import tempfile

import torch
from workloads import (
    CountingBackend,
    compile_and_time,
    interleaved_medians,
    median_seconds,
    model_workloads,
    table,
)

from kiln.integration import backend as kiln_backend
from kiln.integration import explain

DEVICE = "cuda"
# Calls per timed sample of a memory-bound row (and of the copy): each row is ~0.1-0.3 ms of GPU
# time, less than the host's time to call a compiled graph and synchronize, so one call per sample
# measured the host (session 20, H200: eager gelu 0.19 ms against a 0.12 ms copy of the same bytes).
ROW_CALLS = 10


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write)."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=DEVICE)
    b = torch.empty_like(a)
    seconds = median_seconds(lambda: b.copy_(a), 20, device=DEVICE, calls=ROW_CALLS)
    return 2 * a.numel() * a.element_size() / seconds


def gelu(x):
    return torch.nn.functional.gelu(x)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def softmax(x):
    return torch.softmax(x, -1)


def row_workloads(dtype: torch.dtype):
    rows = []
    for width in (1024, 4096, 16384):
        n = (1 << 27) // width  # 128M elements: 256 MB in bfloat16
        x = torch.randn(n, width, device=DEVICE, dtype=dtype)
        w = torch.randn(width, device=DEVICE, dtype=dtype)
        b = torch.randn(width, device=DEVICE, dtype=dtype)
        moved = 2 * x.numel() * x.element_size()  # read x, write the result
        rows.append((f"softmax {n}x{width}", softmax, (x,), moved))
        if width == 4096:
            rows += [(f"gelu {n}x{width}", gelu, (x,), moved), (f"rmsnorm {n}x{width}", rmsnorm, (x, w), moved),
                     (f"layer_norm {n}x{width}", layer_norm, (x, w, b), moved)]
    return rows


def bench(name, fn, args, repeat, moved=None, bandwidth=None, calls=1):
    inductor_fn, inductor_compile, _ = compile_and_time(fn, args, "inductor")
    options = {"cache_dir": tempfile.mkdtemp(prefix="kiln-bench-")}
    counting = CountingBackend(functools.partial(kiln_backend, options=options))
    kiln_fn, kiln_compile, _ = compile_and_time(fn, args, counting)
    times = interleaved_medians({"eager": lambda: fn(*args), "inductor": lambda: inductor_fn(*args),
                                 "kiln": lambda: kiln_fn(*args)}, repeat, device=DEVICE, calls=calls)
    eager, inductor, kiln = times["eager"], times["inductor"], times["kiln"]
    if counting.calls == 0:
        raise RuntimeError(f"{name}: Dynamo never called the kiln backend")
    error = float((kiln_fn(*args).float() - fn(*args).float()).abs().max())
    torch._dynamo.reset()
    report = explain(fn, *args, options=options)
    row = [name, f"{eager * 1e3:.3f}", f"{inductor * 1e3:.3f}", f"{kiln * 1e3:.3f}", f"{eager / kiln:.2f}x",
           f"{inductor / kiln:.2f}x"]
    if moved is not None:
        row += [f"{100 * moved / kiln / bandwidth:.1f}", f"{100 * moved / inductor / bandwidth:.1f}"]
    return row + [str(report.kernel_count), str(len(report.fallback_nodes)), f"{kiln_compile:.1f}", f"{error:.1e}"]


def bert_training_steps(amp: bool = True) -> dict:
    """{"eager" | "inductor" | "kiln": step} for the BERT 6L d768 8x512 training step (forward, a
    mean-square loss, backward; no optimizer), autocast bf16 when `amp`, each backend on its own
    copy of one randomly initialized model (dropout 0)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                                     intermediate_size=3072, vocab_size=8192, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    model = transformers.BertModel(config).to(DEVICE).train()
    ids = torch.randint(0, 8192, (8, 512), device=DEVICE)

    def make_step(module):
        def step():
            with torch.autocast("cuda", torch.bfloat16, enabled=amp):
                loss = module(ids).last_hidden_state.float().square().mean()
            loss.backward()
            return loss.detach()
        return step

    steps = {}
    for label, backend in (("eager", None), ("inductor", "inductor"), ("kiln", kiln_backend)):
        torch._dynamo.reset()
        module = copy.deepcopy(model)
        steps[label] = make_step(module if backend is None else torch.compile(module, backend=backend))
    return steps


def training_step(repeat: int) -> list[str]:
    """The AMP step's median wall time per backend, the backends' steps interleaved (one step of
    each in turn, `repeat` turns): these steps are host-bound, and the host's speed drifts by 30%
    between and within processes (session 19 on an H200: Inductor 13.0 and 17.1 ms a step in two
    runs, each backend timed in a block of its own); interleaved, a drift hits all three alike."""
    steps = bert_training_steps()
    first = {label: float(step()) for label, step in steps.items()}
    times = interleaved_medians(steps, repeat, device=DEVICE)
    eager, inductor, kiln = (times[k] for k in ("eager", "inductor", "kiln"))
    return ["bert 6L d768 8x512 AMP step", f"{eager * 1e3:.1f}", f"{inductor * 1e3:.1f}", f"{kiln * 1e3:.1f}",
            f"{eager / kiln:.2f}x", f"{inductor / kiln:.2f}x",
            f"{first['eager']:.5f} / {first['inductor']:.5f} / {first['kiln']:.5f}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--suite", nargs="+", default=["rows", "models", "train"], choices=["rows", "models", "train"])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", default=None)
    options = parser.parse_args()
    lines = [f"torch {torch.__version__}, {torch.cuda.get_device_name()}, bfloat16"]

    def emit(text: str) -> None:
        lines.append(text)
        print(text, flush=True)
        if options.out:
            with open(options.out, "w") as f:
                f.write("\n".join(lines) + "\n")

    emit(lines[0])
    with torch.no_grad():
        if "rows" in options.suite:
            bandwidth = copy_bandwidth()
            emit(f"device-to-device copy: {bandwidth / 1e9:.0f} GB/s")
            rows = [bench(n, fn, args, options.repeat, moved, bandwidth, ROW_CALLS)
                    for n, fn, args, moved in row_workloads(torch.bfloat16)]
            emit(table(["workload", "eager ms", "inductor ms", "kiln ms", "kiln vs eager", "kiln vs inductor",
                        "kiln % of copy", "inductor % of copy", "kiln kernels", "kiln fallbacks",
                        "kiln compile s", "max err"], rows))
        if "models" in options.suite:
            rows = []
            for name, model, args in model_workloads(DEVICE):
                model = model.to(torch.bfloat16)
                rows.append(bench(name + " bf16", model, args, options.repeat))
                print(f"done: {name}", file=sys.stderr)
            emit(table(["workload", "eager ms", "inductor ms", "kiln ms", "kiln vs eager", "kiln vs inductor",
                        "kiln kernels", "kiln fallbacks", "kiln compile s", "max err"], rows))
    if "train" in options.suite:
        emit(table(["workload", "eager ms", "inductor ms", "kiln ms", "kiln vs eager", "kiln vs inductor",
                    "first loss eager / inductor / kiln"], [training_step(max(5, options.repeat // 3))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
