"""How many times loop bodies are traced (their lowering's `inner_fn` run) and replayed (run
from the recorded `LoopBody`, by handler type) during one CPU compile of a small transformer
block (Linear -> GELU -> LayerNorm -> Linear -> Softmax, 16x64).

    python tools/count_body_runs.py

Issue 11 asks for each body to be traced once per compile; this is the figure it tracks.
Before loop bodies were recorded (session 4), every run was a trace: 66 runs, then 27 once
accesses were cached.
"""

import collections

import torch

from kiln.integration import explain
from kiln.loopir._internal import ir


def main() -> None:
    replays: collections.Counter[str] = collections.Counter()
    traces = collections.Counter()
    real_run, real_record = ir.ComputedBuffer.run, ir.record

    def counted_run(self, ops, index, rindex=()):
        handler = getattr(ops, "_ops", ops)  # through loopir's simplifying wrapper
        replays[type(handler).__name__] += 1
        return real_run(self, ops, index, rindex)

    def counted_record(inner_fn, *sizes):
        def traced(*args):
            traces[id(inner_fn)] += 1
            return inner_fn(*args)
        return real_record(traced, *sizes)

    ir.ComputedBuffer.run, ir.record = counted_run, counted_record
    try:
        block = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                                    torch.nn.Linear(128, 32), torch.nn.Softmax(-1))
        with torch.no_grad():
            report = explain(block, torch.randn(16, 64), options={"fallback": False, "codegen": "cpu"})
    finally:
        ir.ComputedBuffer.run, ir.record = real_run, real_record
    nodes = sum(1 for d in report.fusions)
    print(f"{report.kernel_count} kernels, {nodes} loop bodies, {sum(traces.values())} body traces "
          f"(at most {max(traces.values(), default=0)} per body), {sum(replays.values())} replays: "
          + ", ".join(f"{name} {n}" for name, n in replays.most_common()))


if __name__ == "__main__":
    main()
