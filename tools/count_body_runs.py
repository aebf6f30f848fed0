"""How many times loop bodies run during one CPU compile of a small transformer block
(Linear -> GELU -> LayerNorm -> Linear -> Softmax, 16x64), by handler type.

    python tools/count_body_runs.py

Issue 11 asks for each body to be traced once per compile; this is the figure it tracks.
"""

import collections

import torch

from kiln.integration import explain
from kiln.loopir._internal import ir


def main() -> None:
    counts: collections.Counter[str] = collections.Counter()
    real_run = ir.ComputedBuffer.run

    def counted(self, ops, index, rindex=()):
        handler = getattr(ops, "_ops", ops)  # through loopir's simplifying wrapper
        counts[type(handler).__name__] += 1
        return real_run(self, ops, index, rindex)

    ir.ComputedBuffer.run = counted
    try:
        block = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                                    torch.nn.Linear(128, 32), torch.nn.Softmax(-1))
        with torch.no_grad():
            report = explain(block, torch.randn(16, 64), options={"fallback": False, "codegen": "cpu"})
    finally:
        ir.ComputedBuffer.run = real_run
    nodes = sum(1 for d in report.fusions)
    print(f"{report.kernel_count} kernels, {nodes} loop bodies, {sum(counts.values())} body runs: "
          + ", ".join(f"{name} {n}" for name, n in counts.most_common()))


if __name__ == "__main__":
    main()
