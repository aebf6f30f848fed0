"""Multi-GPU training with kiln against Inductor and uncompiled runs (issue 18).

One process per GPU (torchrun), NCCL with NVLink multicast off. Runs:

* ``ddp``: DDP training of HF BERT-base (MLM head, bf16 autocast, batch 16 per GPU, sequence
  512, AdamW), ``torch.compile(DDP(model))`` with Dynamo's DDPOptimizer (one graph per bucket);
* ``fsdp``: FSDP2 (``fully_shard`` per decoder layer, bf16 parameters / fp32 reduction) training of
  an HF Llama of about 1.1B parameters, each decoder layer compiled before sharding;
* ``ca``: the ``ddp`` model with ``optimize_ddp="python_reducer"`` and compiled autograd, so the
  gradient all-reduces are collectives inside the compiled backward graph.

For each run and backend (``eager`` = uncompiled, ``inductor``, ``kiln``) it reports the median
step time after warm-up, the losses of every step (kiln's against uncompiled), peak memory per GPU,
how many graphs the backend compiled on each rank, and from a profiler trace of two steps the NCCL
kernel time and how much of it overlaps compute kernels. Every dropout probability is 0, so the
compiled and uncompiled runs compute the same function.

    python tools/multigpu.py --out results.md                   # on a machine with 2+ GPUs
    python tools/multigpu.py --device cpu --size tiny --nproc 2  # gloo smoke test of this script
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from gpu_check import zero_dropout  # tools/ is this script's directory

RUNS = ("ddp", "fsdp", "ca")
BACKENDS = ("eager", "inductor", "kiln")
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def build_bert(size: str):
    import transformers as T
    real = size == "real"
    cfg = T.BertConfig(vocab_size=30522 if real else 512, hidden_size=768 if real else 64,
                       num_hidden_layers=12 if real else 2, num_attention_heads=12 if real else 4,
                       intermediate_size=3072 if real else 128, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    batch, seq = (16, 512) if real else (2, 32)
    return zero_dropout(T.BertForMaskedLM(cfg)), cfg.vocab_size, batch, seq


def build_llama(size: str):
    import transformers as T
    real = size == "real"
    cfg = T.LlamaConfig(vocab_size=32000 if real else 512, hidden_size=2048 if real else 64,
                        intermediate_size=5632 if real else 128, num_hidden_layers=16 if real else 2,
                        num_attention_heads=32 if real else 4, num_key_value_heads=4 if real else 2,
                        attention_dropout=0.0)
    batch, seq = (8, 512) if real else (2, 32)
    return zero_dropout(T.LlamaForCausalLM(cfg)), cfg.vocab_size, batch, seq


class CountingBackend:
    """Wraps a backend and counts the graphs handed to it (assert that it really compiled)."""

    def __init__(self, name: str):
        self.name, self.graphs, self.nodes = name, 0, 0
        if name == "kiln":
            from kiln.integration import backend
            self.inner = lambda gm, ex: backend(gm, ex, options={"fallback": False})
        else:
            from torch._dynamo.backends.registry import lookup_backend
            self.inner = lookup_backend(name)

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        self.nodes += sum(n.op == "call_function" for n in gm.graph.nodes)
        return self.inner(gm, example_inputs)


def overlap_summary(prof) -> dict:
    """NCCL kernel time and the part of it during which a compute kernel also runs."""
    from torch.autograd import DeviceType
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start]
    comm = [(e.time_range.start, e.time_range.end) for e in kernels if "nccl" in e.name.lower()]
    compute = sorted((e.time_range.start, e.time_range.end) for e in kernels if "nccl" not in e.name.lower())
    merged: list[list[float]] = []
    for start, end in compute:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    overlapped = 0.0
    for start, end in comm:
        overlapped += sum(max(0.0, min(end, m_end) - max(start, m_start)) for m_start, m_end in merged)
    total = sum(end - start for start, end in comm)
    return {"nccl_us": total, "overlapped_us": overlapped, "compute_us": sum(e - s for s, e in merged)}


def top_kernels(prof, count: int = 12) -> list[tuple[str, float, int]]:
    """(name, total ms, launches) of the GPU kernels that took the most time in the trace."""
    from torch.autograd import DeviceType
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == DeviceType.CUDA and event.time_range.end > event.time_range.start:
            entry = totals.setdefault(event.name[:80], [0.0, 0])
            entry[0] += (event.time_range.end - event.time_range.start) / 1000
            entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:count]
    return [(name, round(ms, 3), int(n)) for name, (ms, n) in ranked]


def make_model(run: str, size: str, device, world: int):
    """(model to step, optimizer, batch maker) with identical weights on every rank."""
    import torch
    torch.manual_seed(0)
    if run == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        model, vocab, batch, seq = build_llama(size)
        model.to(device)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model, vocab, batch, seq = build_bert(size)
        model = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    return model, optimizer, vocab, batch, seq


def compile_model(run: str, model, backend):
    import torch
    if backend is None:
        return model
    if run == "fsdp":
        # Each decoder layer compiled on its own (the FSDP2 recipe); the rest stays eager.
        for layer in model.model.layers:
            layer.compile(backend=backend)
        return model
    return torch.compile(model, backend=backend)


def worker(run: str, backend_name: str, size: str, steps: int, result_path: str) -> None:
    import torch
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available() and os.environ.get("MULTIGPU_DEVICE", "cuda") == "cuda"
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("nccl" if cuda else "gloo")
    if run == "ca":
        torch._dynamo.config.optimize_ddp = "python_reducer"
    # Every FSDP2 block is its own module object, guarded as such: one recompile per block, and
    # Dynamo runs blocks past its recompile limit (8) eagerly, without a word.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 512
    counting = None if backend_name == "eager" else CountingBackend(backend_name)
    model, optimizer, vocab, batch, seq = make_model(run, size, device, world)
    step_model = compile_model(run, model, counting)
    g = torch.Generator().manual_seed(1000 + rank)
    data = [torch.randint(0, vocab, (batch, seq), generator=g) for _ in range(4)]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=run != "fsdp")
    backward_compiler = torch.compile(backend=counting) if run == "ca" and counting else None

    def step(i: int) -> torch.Tensor:
        ids = data[i % len(data)].to(device)
        with autocast:
            loss = step_model(input_ids=ids, labels=ids).loss
        if backward_compiler is not None:
            with torch._dynamo.compiled_autograd._enable(backward_compiler):
                loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    losses, times, first_seconds = [], [], None
    for i in range(steps):
        start = time.perf_counter()
        loss = step(i)
        losses.append(float(loss))  # syncs
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        first_seconds = seconds if i == 0 else first_seconds
        times.append(seconds)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(2):
            step(steps + i)
        if cuda:
            torch.cuda.synchronize()
    overlap = overlap_summary(prof) if cuda else {}
    kernels = top_kernels(prof) if cuda else []
    peak = torch.cuda.max_memory_allocated(device) if cuda else 0
    graphs = torch.tensor([counting.graphs if counting else 0], device=device)
    all_graphs = [torch.zeros_like(graphs) for _ in range(world)]
    dist.all_gather(all_graphs, graphs)
    if rank == 0:
        warm = times[min(3, steps - 1):]
        result = {"run": run, "backend": backend_name, "world": world, "losses": losses,
                  "step_ms": 1000 * statistics.median(warm), "first_step_s": first_seconds,
                  "peak_gib": peak / 2**30, "graphs_per_rank": [int(t) for t in all_graphs],
                  "nodes": counting.nodes if counting else 0, "overlap": overlap, "top_kernels": kernels,
                  "params": sum(p.numel() for p in model.parameters()) * (world if run == "fsdp" else 1)}
        with open(result_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


def launch(run: str, backend: str, args, scratch: str) -> dict:
    path = os.path.join(scratch, f"{run}-{backend}.json")
    env = {**os.environ, **NO_MULTICAST, "MULTIGPU_DEVICE": args.device}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
               __file__, "--worker", run, backend, args.size, str(args.steps), path]
    print(f"[{time.strftime('%H:%M:%S')}] {run} {backend}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, timeout=args.timeout, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.exists(path):
        log_path = os.path.join(args.log_dir or scratch, f"{run}-{backend}.log")
        with open(log_path, "w") as f:
            f.write(proc.stdout + proc.stderr)
        errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "Error" in line or "error:" in line]
        print(f"  failed (rc {proc.returncode}), log in {log_path}:\n" + "\n".join(errors[:20]), flush=True)
        return {"run": run, "backend": backend, "error": errors[0] if errors else f"rc {proc.returncode}"}
    with open(path) as f:
        result = json.load(f)
    print(f"  {time.perf_counter() - start:.0f} s: step {result['step_ms']:.1f} ms, graphs {result['graphs_per_rank']}",
          flush=True)
    return result


def loss_agreement(result: dict, reference: dict | None) -> str:
    if reference is None or "losses" not in reference or "losses" not in result:
        return "-"
    diffs = [abs(a - b) / max(abs(b), 1e-6) for a, b in zip(result["losses"], reference["losses"])]
    return f"{max(diffs):.1e}"


def tables(results: list[dict]) -> str:
    lines = ["| run | backend | step ms | vs uncompiled | first step s | peak GiB/GPU | graphs per rank | "
             "max rel. loss diff vs uncompiled | NCCL ms (2 steps) | overlapped with compute |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by_key = {(r["run"], r["backend"]): r for r in results}
    for r in results:
        if "error" in r:
            lines.append(f"| {r['run']} | {r['backend']} | failed: {r['error'][:120]} |||||||||")
            continue
        eager = by_key.get((r["run"], "eager"))
        speed = f"{eager['step_ms'] / r['step_ms']:.2f}x" if eager and "step_ms" in eager else "-"
        ov = r["overlap"]
        nccl = f"{ov['nccl_us'] / 1000:.1f}" if ov else "-"
        overlapped = f"{100 * ov['overlapped_us'] / ov['nccl_us']:.0f}%" if ov and ov["nccl_us"] else "-"
        lines.append(f"| {r['run']} | {r['backend']} | {r['step_ms']:.1f} | {speed} | {r['first_step_s']:.1f} | "
                     f"{r['peak_gib']:.2f} | {r['graphs_per_rank']} | {loss_agreement(r, eager)} | {nccl} | "
                     f"{overlapped} |")
    for r in results:
        if r.get("top_kernels"):
            lines += ["", f"GPU kernels taking the most time in 2 steps, {r['run']} {r['backend']} (ms, launches):", ""]
            lines += [f"- {ms:.1f} ms, {n}: `{name}`" for name, ms, n in r["top_kernels"]]
    lines += ["", "Losses per step:", ""]
    for r in results:
        if "losses" in r:
            lines.append(f"- {r['run']} {r['backend']}: " + " ".join(f"{x:.4f}" for x in r["losses"]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--size", default="real", choices=["real", "tiny"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--timeout", type=int, default=600, help="seconds per torchrun launch")
    parser.add_argument("--out", help="write the table (markdown) here, and the raw results beside it (.json)")
    parser.add_argument("--log-dir", help="where the whole output of a failed launch goes (default: a scratch dir)")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run, backend, size, steps, path = args.worker
        worker(run, backend, size, int(steps), path)
        return
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for run in args.runs:
            for backend in args.backends:
                results.append(launch(run, backend, args, scratch))
                text = tables(results)
                if args.out:
                    with open(args.out, "w") as f:
                        f.write(text + "\n")
                    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
                        json.dump(results, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
