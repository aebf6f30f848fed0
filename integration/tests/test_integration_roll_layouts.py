"""A returned roll has eager's layout: its input's suggested memory format (a channels-last input
gives a channels-last roll, a transposed matrix a contiguous one), where torch's meta kernel
always says contiguous (fuzz seeds 25000466 and 25000658: a transposed input's roll came back
transposed)."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend, explain

INPUTS = {
    "transposed": lambda: torch.randn(8, 6).t(),
    "channels_last": lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
}


def rolls(x):
    return x.roll(1, 0), x.roll(-2, 1)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("layout", INPUTS)
@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_a_returned_roll_has_eagers_strides(codegen, layout, dynamic):
    x = INPUTS[layout]()
    options = {"fallback": False, "codegen": codegen}
    assert explain(rolls, x, options=options).kernel_count >= 1
    torch._dynamo.reset()
    compiled = torch.compile(rolls, dynamic=dynamic, backend=lambda gm, ex: backend(gm, ex, options=options))
    for got, expected in zip(compiled(x), rolls(x)):
        torch.testing.assert_close(got, expected)
        assert got.stride() == expected.stride()
