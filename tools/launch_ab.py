"""kiln's launch path A/B in one process (GPU): static launches + dispatcher-free output allocation
switched on and off in alternating rounds on the same compiled models, beside Inductor.

    python tools/launch_ab.py

Host time differs a lot between runs of the device machine; alternating inside one process is
what makes the two variants comparable (BENCHMARKS.md, session 9).
"""
import gc
import statistics

import torch
from host_overhead import host_and_wall  # tools/ is this script's directory
from workloads import CountingBackend, model_workloads

from kiln.codegen_triton._internal import launch, runtime
from kiln.integration import backend

FAST_ALLOC = runtime._EMPTY_STRIDED_CUDA

_found = []
def launchers():
    if not _found:
        for o in gc.get_objects():
            try:
                if type(o) is launch.DirectLauncher:
                    _found.append(o)
            except ReferenceError:
                pass
    return _found

def set_mode(on, saved):
    runtime._EMPTY_STRIDED_CUDA = FAST_ALLOC if on else None
    for launcher in launchers():
        for key, entry in list(launcher._launchers.items()):
            if on:
                launcher._launchers[key] = (*entry[:4], saved.get((id(launcher), key)))
            else:
                saved.setdefault((id(launcher), key), entry[4])
                launcher._launchers[key] = (*entry[:4], None)


def ms(seconds):
    return tuple(s * 1e3 for s in seconds)


lines = []
with torch.no_grad():
    for name, model, (ids,) in model_workloads("cuda"):
        if name.split()[0] not in ("bert", "llama"):
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
