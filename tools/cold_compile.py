"""Cold compile on a GPU: time to the first result of an HF model (6 layers, d768, 8x512, bf16).

    KILN_COMPILE_THREADS=0 python tools/cold_compile.py llama    # each kernel compiled at its first launch
    KILN_COMPILE_THREADS=8 python tools/cold_compile.py llama    # compiled by 8 threads after codegen

Run each in a fresh process with empty caches (KILN_CACHE_DIR, TRITON_CACHE_DIR): inference under
no_grad first, then `torch._dynamo.reset()` and a first training step (forward and backward).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from workloads import CountingBackend, model_workloads

from kiln.integration import backend as kiln_backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=["bert", "gpt2", "llama"])
    args = parser.parse_args()
    name, model, (ids,) = next(w for w in model_workloads("cuda") if w[0].startswith(args.model))
    model = model.to(torch.bfloat16)
    counting = CountingBackend(kiln_backend)
    start = time.perf_counter()
    with torch.no_grad():
        torch.compile(model, backend=counting)(ids)
    torch.cuda.synchronize()
    inference = time.perf_counter() - start
    torch._dynamo.reset()
    start = time.perf_counter()
    torch.compile(model.train(), backend=counting)(ids).float().square().mean().backward()
    torch.cuda.synchronize()
    training = time.perf_counter() - start
    if counting.calls < 2:
        raise RuntimeError("Dynamo did not call kiln for both graphs")
    print(f"{name}, KILN_COMPILE_THREADS={os.environ.get('KILN_COMPILE_THREADS', '(default 8)')}: "
          f"inference first call {inference:.1f} s, training first step {training:.1f} s")


if __name__ == "__main__":
    main()
