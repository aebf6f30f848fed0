"""A view of a strided value read by an extern (a matmul) is passed as a view, as eager does,
not copied by a kernel first: attention's output merged back into the hidden size, in every
transformer layer."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend, explain


def merge_heads_then_project(attention_out, weight):
    batch, heads, seq, dim = attention_out.shape
    attention_out = attention_out.reshape(batch, -1, seq, dim)  # as HF's sdpa_attention_forward does
    return attention_out.transpose(1, 2).reshape(batch * seq, heads * dim) @ weight


def _attention_like(batch=2, heads=3, seq=5, dim=4):
    """[b, h, s, d] laid out as [b, s, h, d], as SDPA returns it."""
    return torch.randn(batch, seq, heads, dim).transpose(1, 2)


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_merging_heads_before_a_matmul_is_a_view(codegen):
    x, w = _attention_like(), torch.randn(12, 6)
    options = {"fallback": False, "codegen": codegen}
    report = explain(merge_heads_then_project, x, w, options=options)
    assert report.kernel_count == 0 and report.graphs[0].externs == 1, str(report)
    torch._dynamo.reset()
    compiled = torch.compile(merge_heads_then_project, backend=lambda gm, ex: backend(gm, ex, options=options))
    torch.testing.assert_close(compiled(x, w), merge_heads_then_project(x, w))


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_a_view_eager_refuses_still_copies(codegen):
    x, w = torch.randn(2, 3, 5, 4), torch.randn(12, 6)  # truly [b, h, s, d]: merging heads needs a copy
    options = {"fallback": False, "codegen": codegen}
    report = explain(merge_heads_then_project, x, w, options=options)
    assert report.kernel_count == 1, str(report)
    torch._dynamo.reset()
    compiled = torch.compile(merge_heads_then_project, backend=lambda gm, ex: backend(gm, ex, options=options))
    torch.testing.assert_close(compiled(x, w), merge_heads_then_project(x, w))
