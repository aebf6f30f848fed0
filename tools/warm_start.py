"""Time to the first call's result, in fresh processes: Dynamo alone, Inductor and kiln, cold and warm.

    python tools/warm_start.py [--models bert gpt2] [--repeat 3] [--configs eager inductor kiln]
    python tools/warm_start.py --configs eager-train kiln-train   # a first training step
    python tools/warm_start.py --device cuda --models bert-base   # on a GPU: BERT-base (12L d768, 8x512)

Each measurement is one new Python process that builds a Hugging Face model from a config
(random weights, nothing downloaded), compiles it with `torch.compile` and times its first call
under `torch.no_grad()` (CPU inference; importing torch and transformers and building the model
are not timed, importing kiln is: `backend="kiln"` imports it on the first call). "cold"
runs start with an empty cache directory (kiln's KILN_CACHE_DIR, Inductor's
TORCHINDUCTOR_CACHE_DIR); "warm" runs a second process on the directory the cold one filled.
Prints medians over `--repeat` rounds, then kiln's per-stage times (median of each stage's
total, regions added up, for the cold and the warm runs). `--configs kiln` leaves Dynamo and
Inductor out; `--before DIR` also runs each kiln config from another checkout (e.g. `git
worktree add DIR main`) as "kiln-before" / "kiln-train-before", interleaved with the others,
for a before/after comparison under the same load. `eager-train` and `kiln-train` time a
first training step instead (forward and backward; kiln's warm run loads both graphs from the
whole-graph cache). A warm kiln run that loaded no graph from the cache is warned about. On a
shared machine the figures are noisy: label them so. Each run also counts the modules imported
while it is timed (all, and kiln's own): counts that load on the machine does not change, for
comparing what a warm start costs. `--importtime` runs each child under ``python -X importtime``
and adds each config's kiln import seconds (the self time of kiln's own modules: load-independent
enough to compare, though the flag slows every import a little).

kiln runs from bytecode, as an installed package does (torch's and transformers' bytecode is in
site-packages): the kiln sources measured are byte-compiled first, and the children run without
``PYTHONDONTWRITEBYTECODE`` (set on some development machines, where it would make every fresh
process compile kiln's sources again: a few tenths of a second that no installed kiln pays).
"""

from __future__ import annotations

import argparse
import collections
import compileall
import importlib.util
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import kiln  # the namespace package alone: none of kiln's modules

MODELS = ("bert", "gpt2", "bert-base")


def build_model(name: str, device: str = "cpu"):
    import torch
    import transformers

    torch.manual_seed(0)
    batch, length = 2, 64
    if name == "bert-base":  # 12 layers, d768, 12 heads, input 8x512 (issue 16's GPU size)
        model = transformers.BertModel(transformers.BertConfig())
        batch, length = 8, 512
    elif name == "bert":  # 4 layers, d128, 2 heads, input 2x64
        config = transformers.BertConfig(hidden_size=128, num_hidden_layers=4, num_attention_heads=2,
                                         intermediate_size=512, vocab_size=8192)
        model = transformers.BertModel(config)
    elif name == "gpt2":  # 4 layers, d256, 4 heads, input 2x64
        config = transformers.GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=8192, bos_token_id=0,
                                         eos_token_id=0)
        model = transformers.GPT2Model(config)
    else:
        raise ValueError(f"unknown model {name!r}; choose from {MODELS}")
    ids = torch.randint(0, 8192, (batch, length))
    return model.eval().to(device), ids.to(device)


def child(config: str, model_name: str, device: str) -> None:
    """One measurement: prints a JSON line with the first call's seconds (and kiln's stages).
    A ``-train`` config times a first training step instead: forward and backward of the mean
    square of the model's output, in grad mode (the model stays in eval mode: no dropout)."""
    import torch

    model, ids = build_model(model_name, device)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # compared with eager below
        torch.ones(1, device=device)  # CUDA context made before the timer, as importing torch is
    training = config.endswith("-train")
    config = config.removesuffix("-train")
    reports = []
    modules_before = set(sys.modules)
    start = time.perf_counter()
    if config == "kiln":  # timed: backend="kiln" imports kiln on the first call
        from kiln.integration import KilnOptions
        from kiln.integration._internal.backend import _compile

        options = KilnOptions.create({"fallback": False})

        def backend(gm, example_inputs):
            return _compile(gm, example_inputs, options, reports.append)
    else:
        backend = config
    compiled = torch.compile(model, backend=backend)
    with torch.set_grad_enabled(training):
        out = compiled(ids).last_hidden_state
        if training:
            out.square().mean().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        expected = model(ids).last_hidden_state
    error = float((out - expected).abs().max())
    stages: dict[str, float] = collections.defaultdict(float)
    for report in reports:
        for stage, spent in report.stage_seconds:
            stages[stage.split(":")[0].split("/")[-1]] += spent
    imported = set(sys.modules) - modules_before
    print(json.dumps({"seconds": seconds, "error": error, "graphs": len(reports),
                      "modules": len(imported), "kiln_modules": sum(m.startswith("kiln.") for m in imported),
                      "kernels": sum(r.kernels for r in reports), "cached": sum(r.cached for r in reports),
                      "stages": stages}))


def source_dirs(tree: pathlib.Path) -> list[str]:
    """The directories running kiln from the checkout `tree` (each package's src, then integration's)."""
    return [*(str(p) for p in sorted((tree / "packages").glob("*/src"))), str(tree / "integration" / "src")]


def source_path(tree: pathlib.Path) -> str:
    """PYTHONPATH running kiln from the checkout `tree`."""
    return os.pathsep.join(source_dirs(tree))


def imported_kiln_packages() -> list[str]:
    """The directory of each kiln package this interpreter (and a child with its PYTHONPATH) imports."""
    names = sorted({path.parent.name for entry in kiln.__path__ for path in pathlib.Path(entry).glob("*/__init__.py")})
    specs = [importlib.util.find_spec(f"kiln.{name}") for name in names]
    return [spec.submodule_search_locations[0] for spec in specs if spec is not None and spec.submodule_search_locations]


def byte_compile(before: pathlib.Path | None) -> None:
    """Byte-compile the kiln sources the children run (an installed package's are; see the module
    docstring): the packages on this PYTHONPATH, and those of `before`."""
    for directory in imported_kiln_packages() + (source_dirs(before) if before is not None else []):
        compileall.compile_dir(directory, quiet=1)


_IMPORT_TIME = re.compile(r"^import time:\s*(\d+) \|\s*\d+ \|\s*(kiln\.\S+)", re.MULTILINE)


def kiln_import_seconds(stderr: str) -> float:
    """The self time of kiln's own modules in a ``-X importtime`` report."""
    return sum(int(micros) for micros, _ in _IMPORT_TIME.findall(stderr)) / 1e6


def measure(config: str, model_name: str, cache: pathlib.Path, before: pathlib.Path | None = None,
            device: str = "cpu", importtime: bool = False) -> dict:
    env = dict(os.environ, KILN_CACHE_DIR=str(cache / "kiln"), TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
               TRITON_CACHE_DIR=str(cache / "triton"), PYTHONHASHSEED="0")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if config.endswith("-before"):
        env["PYTHONPATH"] = source_path(before)
    flags = ["-X", "importtime"] if importtime else []
    done = subprocess.run([sys.executable, *flags, __file__, "--child", config.replace("-before", ""), model_name,
                           device], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{config} {model_name} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "kiln_import_seconds": kiln_import_seconds(done.stderr)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--configs", nargs="+", default=["eager", "inductor", "kiln"],
                        choices=["eager", "inductor", "kiln", "eager-train", "inductor-train", "kiln-train"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", type=pathlib.Path, help="another checkout whose kiln runs as kiln-before")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--importtime", action="store_true", help="run children under -X importtime")
    parser.add_argument("--child", nargs=3, metavar=("CONFIG", "MODEL", "DEVICE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    byte_compile(args.before)
    rows = []
    for model_name in args.models:
        times: dict[str, list[float]] = collections.defaultdict(list)
        stages: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        modules: dict[str, list[int]] = collections.defaultdict(list)
        configs = args.configs + ([f"{c}-before" for c in args.configs if c.startswith("kiln")] if args.before else [])
        for _ in range(args.repeat):
            for config in configs:
                with tempfile.TemporaryDirectory(prefix="kiln-warm-start-") as scratch:
                    for temperature in ("cold", "warm") if not config.startswith("eager") else ("",):
                        result = measure(config, model_name, pathlib.Path(scratch), args.before, args.device,
                                         args.importtime)
                        label = f"{config} {temperature}".strip()
                        times[label].append(result["seconds"])
                        modules[label].append(result["modules"])
                        modules[f"{label} (kiln's)"].append(result["kiln_modules"])
                        if args.importtime and config.startswith("kiln"):
                            stages[(label, "kiln imports (-X importtime self)")].append(result["kiln_import_seconds"])
                        for stage, spent in result["stages"].items():
                            stages[(f"{config} {temperature}", stage)].append(spent)
                        if temperature == "warm" and config.startswith("kiln") and not result["cached"]:
                            print(f"warning: {label} {model_name}: no graph came from the whole-graph cache")
                        if result["error"] > 1e-3:
                            print(f"warning: {label} {model_name} differs from eager by {result['error']:.2e}")
        for label, values in times.items():
            rows.append((model_name, label, statistics.median(values), min(values), max(values)))
        for (label, stage), values in sorted(stages.items()):
            rows.append((model_name, f"  {label} stage {stage}", statistics.median(values), min(values), max(values)))
        for label, values in modules.items():
            rows.append((model_name, f"  {label} modules imported (count)", statistics.median(values), min(values),
                         max(values)))
    print(f"first call on {args.device}, fresh processes, medians of {args.repeat} (seconds)")
    print("| model | what | median | min | max |\n|---|---|---|---|---|")
    for model_name, label, median, low, high in rows:
        print(f"| {model_name} | {label} | {median:.2f} | {low:.2f} | {high:.2f} |")


if __name__ == "__main__":
    main()
