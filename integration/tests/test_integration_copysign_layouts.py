"""copysign of a channels-last or transposed operand and a contiguous one, compiled with
fallback=False: outputs have eager's strides (eager follows the first operand; the FakeTensor
Dynamo hands over follows torch's reference decomposition, `where(signbit(b), ...)`, so `b`),
also for pointwise ops of its result, and eager's values."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend


def _copysign_then_more(a, b):
    y = torch.copysign(a, b)
    return y, y * 2 + 1, torch.copysign(b, a)


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
@pytest.mark.parametrize("strided_first", [True, False])
def test_copysign_of_mixed_layouts_has_eagers_strides(codegen, layout, strided_first):
    compiled = torch.compile(_copysign_then_more,
                             backend=lambda gm, ex: backend(gm, ex, options={"fallback": False, "codegen": codegen}))
    x = torch.randn(2, 3, 4, 5)
    strided = x.to(memory_format=torch.channels_last) if layout == "channels_last" else x.transpose(1, 3)
    plain = torch.randn(strided.shape)
    a, b = (strided, plain) if strided_first else (plain, strided)
    for got, want in zip(compiled(a, b), _copysign_then_more(a, b), strict=True):
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride(), (got.stride(), want.stride())
