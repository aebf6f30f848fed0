"""Scans of channels-last and transposed values (loopir's `lower_scan` asks eager's layout of the
scanned value which dim is contiguous, as reductions do): eager's values and strides on the C++
and Triton codegens (the split direction itself: loopir's test_loopir_row_cuts.py)."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend, explain

CODEGENS = ("cpu", "cuda")  # "cuda" is the Triton codegen; under TRITON_INTERPRET=1 on the CPU


def _x(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed)  # drawn on the CPU, then to the default device (conftest.py)
    return torch.randn(*shape, generator=gen, device="cpu").to(torch.get_default_device())


CASES = {
    "cumsum_channels_last_over_channels": (lambda x: x.cumsum(1),
                                           lambda: _x(2, 8, 4, 5).to(memory_format=torch.channels_last)),
    "cumprod_channels_last_over_width": (lambda x: (x * 0.1 + 1).cumprod(3),
                                         lambda: _x(2, 8, 4, 5).to(memory_format=torch.channels_last)),
    "cummax_transposed_contiguous_dim": (lambda x: x.t().cummax(0), lambda: _x(6, 300)),
    "logcumsumexp_transposed": (lambda x: x.t().logcumsumexp(1), lambda: _x(40, 7)),
}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_scan_of_a_permuted_value_matches_eager(name, codegen):
    fn, make = CASES[name]
    x = make()
    report = explain(fn, x, options={"fallback": False, "codegen": codegen})
    assert report.kernel_count >= 1 and not report.fallback_nodes, str(report)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options={"fallback": False,
                                                                                 "codegen": codegen}))
    got, want = compiled(x), fn(x)
    for g, w in zip(*((got, want) if isinstance(want, tuple) else ((got,), (want,)))):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
        assert g.stride() == w.stride(), (g.stride(), w.stride())
