"""GPU differential check: training gradients of Hugging Face models, kiln and Inductor vs eager.

For each model and size, each of `--processes` fresh processes builds the model from a config
(random weights, every dropout probability 0), compiles one copy with kiln (`fallback=False`)
and one with Inductor, and runs six training calls on each compiled model: three with the
loss `(h * R).sum()` (R a fixed random tensor) and three with `h.pow(2).mean()`, in that
order in odd processes and the other way round in even ones, so that each loss is also the
first call of some process. After every call the forward output and every parameter's
gradient are compared with eager's for that loss.

Pass rule, per tensor t (an output or a gradient), against eager run in float64 on the same
weights and inputs: err(t) = max|t - t64| / max(max|t64|, 1e-3 * S), where S is the largest
|value| over all gradients of that call (over the output, for outputs), so that gradients
that are zero up to rounding (a key bias under softmax) do not divide noise by noise. A
backend passes a call when err(t) <= 3 * E + 1e-5 for every tensor, E being the largest
err that float32 rounding gives eager itself over the tensors of that model and loss: the
model's own conditioning. Randomly initialized T5 at d512 loses two digits in float32 (E
about 1e-2, in whichever ReLU layers it happens to be), BERT about four; a wrong kernel
gives errors of order 1. NaN where float64 has none fails. Gradients float64 leaves None
must be None or all-zero.

    python tools/gpu_check.py --sizes small real --out gpu_check.md     # on a GPU machine
    nox -s gpu_check -- --sizes small                                    # the same, through nox

Prints a table per (model, size): the worst err of kiln and of Inductor over every call,
loss, tensor and process, and where it is; `--out` also gets the per-call rows.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time

FLOOR = 1e-3  # of the largest |gradient|: the smallest scale a tensor's error is measured against
MULTIPLIER, SLACK = 3.0, 1e-5  # pass: err <= MULTIPLIER * (eager float32's worst err) + SLACK
MODELS = ("bert", "gpt2", "t5", "llama", "distilbert", "vit")


def zero_dropout(model):
    """Dropout off everywhere: nn.Dropout modules and the float `*dropout*` attributes HF keeps."""
    import torch
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(module, name, 0.0)
    return model


def build(name: str, size: str):
    """(model, make_input, description) for one model at 'small' or 'real' size."""
    import torch
    import transformers as T
    real = size == "real"
    if name == "bert":
        cfg = T.BertConfig(vocab_size=30522 if real else 1000, hidden_size=768 if real else 64,
                           num_hidden_layers=12 if real else 2, num_attention_heads=12 if real else 4,
                           intermediate_size=3072 if real else 128, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
        model, shape = T.BertModel(cfg), (8, 512) if real else (2, 64)
    elif name == "gpt2":
        cfg = T.GPT2Config(vocab_size=50257 if real else 1000, n_embd=768 if real else 64,
                           n_layer=12 if real else 2, n_head=12 if real else 4, resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0)
        model, shape = T.GPT2Model(cfg), (4, 128) if real else (2, 64)
    elif name == "t5":
        cfg = T.T5Config(vocab_size=32128 if real else 1000, d_model=512 if real else 64, d_kv=64 if real else 16,
                         d_ff=2048 if real else 128, num_layers=6 if real else 2, num_heads=8 if real else 4,
                         dropout_rate=0.0)
        model, shape = T.T5EncoderModel(cfg), (8, 512) if real else (2, 64)
    elif name == "llama":
        cfg = T.LlamaConfig(vocab_size=32000 if real else 1000, hidden_size=1024 if real else 512,
                            intermediate_size=2816 if real else 1024, num_hidden_layers=4 if real else 2,
                            num_attention_heads=16 if real else 4, num_key_value_heads=4 if real else 2)
        model, shape = T.LlamaModel(cfg), (8, 512) if real else (2, 64)
    elif name == "distilbert":
        cfg = T.DistilBertConfig(vocab_size=30522 if real else 1000, dim=768 if real else 64,
                                 n_layers=6 if real else 2, n_heads=12 if real else 4,
                                 hidden_dim=3072 if real else 128, dropout=0.0, attention_dropout=0.0)
        model, shape = T.DistilBertModel(cfg), (8, 512) if real else (2, 64)
    elif name == "vit":
        cfg = T.ViTConfig(image_size=224 if real else 32, patch_size=16 if real else 8,
                          hidden_size=768 if real else 64, num_hidden_layers=12 if real else 2,
                          num_attention_heads=12 if real else 4, intermediate_size=3072 if real else 128,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        model = T.ViTModel(cfg, add_pooling_layer=False)
        side = cfg.image_size
        return zero_dropout(model), lambda g: torch.randn(8 if real else 2, 3, side, side, generator=g), \
            f"{cfg.num_hidden_layers}L d{cfg.hidden_size} {8 if real else 2}x3x{side}x{side}"
    else:
        raise SystemExit(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    vocab = cfg.vocab_size
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layers", None) or cfg.num_layers
    width = getattr(cfg, "hidden_size", None) or getattr(cfg, "dim", None)
    return zero_dropout(model), lambda g: torch.randint(0, vocab, shape, generator=g), \
        f"{layers}L d{width} {shape[0]}x{shape[1]}"


def tensor_error(got, want, scale: float) -> float:
    import torch
    if got is None or want is None:
        other = want if got is None else got
        return 0.0 if other is None or not bool(other.any()) else float("inf")
    if bool((got.isnan() & ~want.isnan()).any()):
        return float("inf")
    denominator = max(float(want.abs().max()), FLOOR * scale, torch.finfo(torch.float32).tiny)
    return float((got.double() - want.double()).abs().max()) / denominator


def errors_against(out, grads, exact_out, exact_grads) -> dict[str, float]:
    """err (see the module docstring) of the output and of every gradient against float64's."""
    scale = max((float(w.abs().max()) for w in exact_grads.values() if w is not None), default=0.0)
    errors = {n: tensor_error(grads[n], exact_grads[n], scale) for n in exact_grads}
    errors["<output>"] = tensor_error(out, exact_out, float(exact_out.abs().max()))
    return errors


def worker(name: str, size: str, process: int, device: str = "cuda") -> dict:
    """One fresh process: eager references, then kiln and Inductor, six calls each."""
    import torch

    from kiln.integration import backend as kiln_backend
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model, make_input, description = build(name, size)
    model = model.to(device).train()
    g = torch.Generator().manual_seed(1)
    x = make_input(g).to(device)
    with torch.no_grad():
        h_shape = model(x).last_hidden_state.shape
    R = torch.randn(h_shape, generator=g).to(device)
    losses = {"proj": lambda h: (h * R.to(h.dtype)).sum(), "msq": lambda h: h.pow(2).mean()}
    order = ["proj"] * 3 + ["msq"] * 3 if process % 2 else ["msq"] * 3 + ["proj"] * 3

    def step(module, params, loss_name, inputs=x):
        for p in params.values():
            p.grad = None
        h = module(inputs).last_hidden_state
        losses[loss_name](h).backward()
        return h.detach().clone(), {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in params.items()}

    def eager(loss_name, dtype):
        eager_model = copy.deepcopy(model).to(dtype)
        inputs = x.to(dtype) if x.is_floating_point() else x
        return step(eager_model, dict(eager_model.named_parameters()), loss_name, inputs)

    exact = {loss_name: eager(loss_name, torch.float64) for loss_name in losses}
    eager32 = {loss_name: errors_against(*eager(loss_name, torch.float32), *exact[loss_name]) for loss_name in losses}
    result = {"model": name, "size": size, "process": process, "description": description, "backends": {}}
    for label in ("kiln", "inductor"):
        torch._dynamo.reset()
        compiled_model = copy.deepcopy(model)
        params = dict(compiled_model.named_parameters())
        calls = {"graphs": 0}
        if label == "kiln":
            def counted(gm, example_inputs, calls=calls):
                calls["graphs"] += 1
                return kiln_backend(gm, example_inputs, options={"fallback": False})
            compiled = torch.compile(compiled_model, backend=counted)
        else:
            compiled = torch.compile(compiled_model, backend="inductor")
        rows = []
        start = time.perf_counter()
        try:
            for number, loss_name in enumerate(order, 1):
                out, grads = step(compiled, params, loss_name)
                if device == "cuda":
                    torch.cuda.synchronize()
                errors = errors_against(out, grads, *exact[loss_name])
                rounding = max(eager32[loss_name].values())
                limit = MULTIPLIER * rounding + SLACK
                worst = max(errors, key=lambda n: errors[n])
                rows.append({"call": number, "loss": loss_name, "score": errors[worst] / limit,
                             "err": errors[worst], "eager_err": rounding, "where": worst,
                             "failing": sum(e > limit for e in errors.values()), "tensors": len(errors)})
                if number == 1:
                    first_seconds = time.perf_counter() - start
        except Exception as error:  # a crash is a result too: the table shows it
            rows.append({"call": len(rows) + 1, "error": f"{type(error).__name__}: {str(error)[:300]}"})
            first_seconds = time.perf_counter() - start
        result["backends"][label] = {"rows": rows, "first_call_seconds": round(first_seconds, 1),
                                     "graphs": calls["graphs"] if label == "kiln" else None}
        if label == "kiln" and calls["graphs"] == 0:
            rows.append({"call": 0, "error": "kiln compiled no graph (Dynamo ran eagerly)"})
        del compiled, compiled_model, params
        if device == "cuda":
            torch.cuda.empty_cache()
    return result


def worst_of(runs: list[dict], label: str) -> tuple[dict | None, str, str]:
    """(worst row, where, worst score per call number) over the processes of one case."""
    worst, where, per_call = None, "", [0.0] * 6
    for run in runs:
        for row in run["backends"][label]["rows"]:
            if "error" in row:
                return {"score": float("inf"), "err": float("nan"), "eager_err": float("nan")}, row["error"], "-"
            if worst is None or row["score"] > worst["score"]:
                worst, where = row, f"{row['where']} (call {row['call']}, {row['loss']}, process {run['process']})"
            per_call[row["call"] - 1] = max(per_call[row["call"] - 1], row["score"])
    return worst, where, " / ".join(f"{e:.2f}" for e in per_call)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--sizes", nargs="+", default=["small", "real"], choices=["small", "real"])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per worker process")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test of this script")
    parser.add_argument("--out", help="write the tables (markdown) and per-call rows (JSON beside it) here")
    parser.add_argument("--worker", nargs=3, metavar=("MODEL", "SIZE", "PROCESS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        name, size, process = args.worker
        print("RESULT " + json.dumps(worker(name, size, int(process), args.device)), flush=True)
        return
    results, started = [], time.perf_counter()
    for size in args.sizes:
        for name in args.models:
            for process in range(1, args.processes + 1):
                t0 = time.perf_counter()
                command = [sys.executable, __file__, "--worker", name, size, str(process), "--device", args.device]
                try:
                    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
                    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
                    if line is None:
                        raise RuntimeError(f"worker exited {done.returncode}: {done.stderr[-600:]}")
                    results.append(json.loads(line[len("RESULT "):]))
                except (subprocess.TimeoutExpired, RuntimeError) as error:
                    failure = {"rows": [{"call": 1, "error": str(error)[-300:]}], "first_call_seconds": None}
                    results.append({"model": name, "size": size, "process": process, "description": "",
                                    "backends": {"kiln": failure, "inductor": failure}})
                print(f"[{time.perf_counter() - started:6.0f}s] {name} {size} process {process}: "
                      f"{time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
                if args.out:  # after every process: a run stopped early keeps what it measured
                    write(args.out, results)
    print(report(results))


def write(path: str, results: list[dict]) -> None:
    with open(path, "w") as f:
        f.write(report(results) + "\n")
    with open(os.path.splitext(path)[0] + ".json", "w") as f:
        json.dump(results, f, indent=1)


def report(results: list[dict]) -> str:
    """One row per (model, size): each backend's worst score (err / (3 E + 1e-5), <= 1 passes)
    over every call, loss, tensor and process, with the err and E behind it."""
    lines = ["| model | size | kiln score | kiln err (E) | kiln score, calls 1-6 | kiln | "
             "Inductor score | Inductor err (E) | Inductor | first call s (kiln / Inductor) | "
             "kiln worst at |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    cases: dict[tuple[str, str], list[dict]] = {}
    for run in results:
        cases.setdefault((run["model"], run["size"]), []).append(run)
    verdict = {True: "pass", False: "**FAIL**"}
    for (name, size), runs in cases.items():
        kiln, kiln_where, kiln_calls = worst_of(runs, "kiln")
        inductor, _, _ = worst_of(runs, "inductor")
        seconds = " / ".join(str(runs[0]["backends"][b].get("first_call_seconds")) for b in ("kiln", "inductor"))
        lines.append(f"| {name} | {size}: {runs[0]['description']} | {kiln['score']:.2f} | {kiln['err']:.1e} "
                     f"({kiln['eager_err']:.1e}) | {kiln_calls} | {verdict[kiln['score'] <= 1]} | "
                     f"{inductor['score']:.2f} | {inductor['err']:.1e} ({inductor['eager_err']:.1e}) | "
                     f"{verdict[inductor['score'] <= 1]} | {seconds} | {kiln_where} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
