"""kiln's launch path A/B in one process (GPU): a launch-path change switched on and off in
alternating rounds on the same compiled models, beside Inductor.

    python tools/launch_ab.py [--switch static|fast] [--models bert llama gpt2]

`--switch static` (default): static launches + dispatcher-free output allocation (session 9);
`--switch fast`: the one-frame launch of static kernels (codegen_triton `fast_launch.py`).
Host time differs a lot between runs of the device machine; alternating inside one process is
what makes the two variants comparable (BENCHMARKS.md, session 9).
"""
import argparse
import gc
import statistics

import torch
from host_overhead import host_and_wall  # tools/ is this script's directory
from workloads import CountingBackend, model_workloads

from kiln.codegen_triton._internal import launch, runtime
from kiln.integration import backend

FAST_ALLOC = runtime._EMPTY_STRIDED_CUDA

_found = {}
def instances(kind):
    if kind not in _found:
        _found[kind] = []
        for o in gc.get_objects():
            try:
                if type(o) is kind:
                    _found[kind].append(o)
            except ReferenceError:
                pass
    return _found[kind]

def set_static(on, saved):
    runtime._EMPTY_STRIDED_CUDA = FAST_ALLOC if on else None
    for launcher in instances(launch.DirectLauncher):
        for key, entry in list(launcher._launchers.items()):
            if on:
                launcher._launchers[key] = (*entry[:4], saved.get((id(launcher), key)))
            else:
                saved.setdefault((id(launcher), key), entry[4])
                launcher._launchers[key] = (*entry[:4], None)

def set_fast(on, saved):
    for kernel in instances(runtime.TritonKernel):
        if on:
            kernel._fast = saved.get(id(kernel), kernel._fast)
        else:
            saved.setdefault(id(kernel), kernel._fast)
            kernel._fast = False


def ms(seconds):
    return tuple(s * 1e3 for s in seconds)


parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--switch", choices=["static", "fast"], default="static")
parser.add_argument("--models", nargs="+", default=["bert", "llama"])
cli = parser.parse_args()
set_mode = set_static if cli.switch == "static" else set_fast
print(f"switch: {cli.switch}; fast launches built: counted after the rounds")
lines = []
with torch.no_grad():
    for name, model, (ids,) in model_workloads("cuda"):
        if name.split()[0] not in cli.models:
            continue
        model = model.to(torch.bfloat16)
        torch._dynamo.reset()
        inductor = torch.compile(model)
        counting = CountingBackend(backend)
        f = torch.compile(model, backend=counting)
        for _ in range(3):
            f(ids)
            inductor(ids)
        if counting.calls == 0:
            raise RuntimeError(f"{name}: Dynamo never called kiln")
        saved = {}
        _found.clear()
        kernels = instances(runtime.TritonKernel)
        print(f"{name}: {sum(callable(k._fast) for k in kernels)} of {len(kernels)} Triton kernels launch in one frame",
              flush=True)
        res = {"off": [], "on": [], "inductor": []}
        for _ in range(7):
            for mode in ("off", "on"):
                set_mode(mode == "on", saved)
                res[mode].append(ms(host_and_wall(f, (ids,), repeat=30)))
            res["inductor"].append(ms(host_and_wall(inductor, (ids,), repeat=30)))
        set_mode(True, saved)
        med = {k: (statistics.median(h for h, _ in v), statistics.median(w for _, w in v)) for k, v in res.items()}
        lines.append(f"| {name} bf16 | {med['off'][0]:.2f} / {med['off'][1]:.2f} | {med['on'][0]:.2f} / {med['on'][1]:.2f} | "
                     f"{med['inductor'][0]:.2f} / {med['inductor'][1]:.2f} | "
                     + " ".join(f"{a[1] / b[1]:.2f}" for a, b in zip(res['on'], res['inductor'])) + " |")
        print(lines[-1], flush=True)
print("| workload | kiln before: host / wall ms | kiln now | Inductor | kiln now / Inductor wall per round |")
print("\n".join(lines))
