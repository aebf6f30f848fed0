"""Where a training step's time goes: eager vs Inductor vs kiln on one HF model.

    python tools/profile_training.py --model bert --amp [--rows 30]
    python tools/profile_training.py --model gpt2 --inference   # bf16 forward, no_grad

`--inference` profiles the bfloat16 forward of `tools/bench_low_precision.py`'s models (6 layers,
d768, 8x512) instead, with kiln's default fallback (attention stays eager ATen, as in Inductor).

For each backend: builds the model (random weights, dropout 0), compiles it (kiln with
``fallback=False``; the backend call is counted), runs warm-up steps, then reports the wall time
per step, the GPU time per step and kernel launches per step from a profiler trace, the host
(CPU) time the step spends before the GPU is idle, and the top GPU kernels. The last table,
for kiln, groups kernels by whether kiln generated them.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers as T
from gpu_check import zero_dropout
from workloads import CountingBackend, model_workloads

from kiln.integration import backend as kiln_backend


def build(name: str):
    if name == "bert":
        cfg = T.BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return T.BertForMaskedLM(cfg), cfg.vocab_size, (16, 512)
    if name == "llama":
        cfg = T.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                            num_attention_heads=16, num_key_value_heads=4)
        return T.LlamaForCausalLM(cfg), cfg.vocab_size, (8, 512)
    raise SystemExit(f"unknown model {name!r}")


def inference_step(backend_name: str, args):
    """(step function, counting backend or None): a bfloat16 forward under no_grad."""
    (model, ids), = [(m, a[0]) for n, m, a in model_workloads("cuda") if n.startswith(args.model)]
    model = model.to(torch.bfloat16)
    counting = CountingBackend(kiln_backend) if backend_name == "kiln" else None
    compiled = {"kiln": lambda: torch.compile(model, backend=counting), "inductor": lambda: torch.compile(model),
                "eager": lambda: model}[backend_name]()

    def step():
        with torch.no_grad():
            return compiled(ids)
    return step, counting


def run(backend_name: str, args) -> None:
    torch.manual_seed(0)
    if args.inference:
        step, counting = inference_step(backend_name, args)
        measure(backend_name, step, counting, args)
        return
    model, vocab, shape = build(args.model)
    model = zero_dropout(model).cuda().train()
    counting = None
    if backend_name == "kiln":
        counting = CountingBackend(lambda gm, ex: kiln_backend(gm, ex, options={"fallback": False}))
        step_model = torch.compile(model, backend=counting)
    elif backend_name == "inductor":
        step_model = torch.compile(model)
    else:
        step_model = model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    ids = torch.randint(0, vocab, shape, device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.amp):
            loss = step_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    measure(backend_name, step, counting, args)


def measure(backend_name: str, step, counting, args) -> None:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls, hosts = [], []
    for _ in range(10):
        start = time.perf_counter()
        step()
        hosts.append(time.perf_counter() - start)  # host time to enqueue the step
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(e.self_device_time_total for e in kernels) / 2 / 1e3
    launches = sum(e.count for e in kernels) / 2
    calls = f", backend calls {counting.calls}" if counting else ""
    print(f"\n## {backend_name}: wall {1e3 * statistics.median(walls):.1f} ms/step, host enqueue "
          f"{1e3 * statistics.median(hosts):.1f} ms/step, GPU busy {gpu_ms:.1f} ms/step, {launches:.0f} kernels/step"
          f"{calls}")
    if backend_name == "kiln":
        generated = [e for e in kernels if e.key.startswith("kernel") or "kiln" in e.key]
        print(f"kiln-generated kernels: {sum(e.count for e in generated) / 2:.0f}/step, "
              f"{sum(e.self_device_time_total for e in generated) / 2 / 1e3:.1f} ms/step")
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=70))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="bert", choices=["bert", "llama", "gpt2"])
    parser.add_argument("--amp", action="store_true", help="autocast bfloat16")
    parser.add_argument("--inference", action="store_true", help="a bfloat16 forward under no_grad")
    parser.add_argument("--backends", nargs="+", default=["eager", "inductor", "kiln"])
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--no-tf32", action="store_true", help="float32 matmuls in full precision (torch's default)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = not args.no_tf32
    for name in args.backends:
        torch._dynamo.reset()
        run(name, args)


if __name__ == "__main__":
    main()
