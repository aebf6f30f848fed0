"""Compiled regions keep eager's layouts where something can observe them (issue 19's silent
wrong result: an eager as_strided reading a compiled channels-last value's storage)."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend, explain

aten = torch.ops.aten


def _compiled(fn, codegen):
    return torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options={"fallback": False, "codegen": codegen}))


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_as_strided_of_a_compiled_channels_last_value_matches_eager(codegen):
    x = torch.randn(8, 384, 20, 20).to(memory_format=torch.channels_last)

    def f(x):
        return aten.as_strided(x + 1, (8, 384, 2, 20, 12), (153600, 1, 61440, 384, 7680), 0) + 2

    report = explain(f, x, options={"fallback": False, "codegen": codegen})
    assert report.kernel_count >= 1
    torch._dynamo.reset()
    torch.testing.assert_close(_compiled(f, codegen)(x), f(x))


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_outputs_keep_channels_last_and_transposed_layouts(codegen):
    x = torch.randn(2, 6, 5, 4).to(memory_format=torch.channels_last)
    y = torch.randn(7, 9).t()

    def f(x, y):
        return x * 2 + 1, torch.relu(y) * y

    got, expected = _compiled(f, codegen)(x, y), f(x, y)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
        assert g.stride() == e.stride()
    assert got[0].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_as_strided_of_a_dynamic_channels_last_value_matches_eager(codegen):
    # dynamic shapes: `x + 1`'s channels-last strides are expressions of the batch size
    def f(x):
        return aten.as_strided(x + 1, (x.shape[0], 384, 2, 20, 12), (153600, 1, 61440, 384, 7680), 0) + 2

    compiled = torch.compile(f, backend="kiln", options={"fallback": False, "codegen": codegen}, dynamic=True)
    for batch in (3, 5):
        x = torch.randn(batch, 384, 20, 20).to(memory_format=torch.channels_last)
        torch.testing.assert_close(compiled(x), f(x))
    # fewer channels: the view's strides address past the value's elements; eager refuses it,
    # and so does kiln (each address is checked at run time: its range is not known for every size)
    small = torch.randn(3, 200, 20, 20).to(memory_format=torch.channels_last)
    with pytest.raises(RuntimeError):
        f(small)
    with pytest.raises((IndexError, RuntimeError)):
        compiled(small)


def test_split_chunks_of_a_matmul_are_views_of_its_buffer():
    # GPT-2's c_attn(...).split(...): decomp's as_strided chunks of the addmm result are read
    # in place (strides of its buffer), not left to eager
    w, b = torch.randn(16, 48), torch.randn(48)

    def f(x):
        q, k, v = torch.nn.functional.linear(x, w.t(), b).split(16, dim=2)
        return q * k + v

    x = torch.randn(2, 5, 16)
    report = explain(f, x, options={"fallback": False, "codegen": "cpu"})
    assert report.kernel_count >= 1 and not report.fallback_nodes, str(report)
    torch._dynamo.reset()
    torch.testing.assert_close(_compiled(f, "cpu")(x), f(x))
