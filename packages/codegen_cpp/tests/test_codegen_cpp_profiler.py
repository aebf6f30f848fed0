"""Under torch.profiler every kernel call is a named range (`kiln::kernel0`, ...), so kiln's own
kernels show in its tables next to the ATen ops; without a profiler nothing is recorded."""

from __future__ import annotations

import torch


def test_kernels_are_named_ranges_under_the_profiler(cpp):
    x = torch.randn(64, 32)
    compiled = cpp.check(lambda x: (torch.relu(x) * 2).sum(-1), x)
    names = [k.name for k in compiled.kernel_graph.kernels]
    with torch.profiler.profile() as prof:
        for _ in range(3):
            compiled.module(x)
    counts = {e.key: e.count for e in prof.key_averages()}
    assert names and all(counts.get(f"kiln::{name}") == 3 for name in names), counts
    with torch.autograd.profiler.record_function("outside"):  # no profiler: the call still runs
        cpp.assert_same(compiled.module(x), (torch.relu(x) * 2).sum(-1))
