"""Boolean attention masks the fused kernels cannot read (last stride not 1, as Hugging Face's
expanded masks are while compiled) are made contiguous before tracing inference graphs
(`attention_masks.py`), on CUDA only, so tracing picks the fused kernel eager picks for a dense
mask; query rows whose mask is all False give zeros, as eager's math fallback does."""

from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from kiln.integration import GraphReport, KilnOptions
from kiln.integration._internal.attention_masks import additive_mask, densify_attention_masks
from kiln.integration._internal.backend import _compile

SDPA = torch._C._nn.scaled_dot_product_attention
FUSED = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
         "_scaled_dot_product_flash_attention")


def strided_mask_attention(q, k, v, rows):
    """The layout HF's compiled BERT mask has: (batch, 1, L, S) with strides (0, S, 1, 0)."""
    mask = rows[None, None, :, None].expand(q.shape[0], 1, q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _inputs(device=None, dtype=torch.float32):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, device=device, dtype=dtype) for _ in range(3))
    rows = torch.rand(16, device=device) > 0.2
    rows[0] = True
    return q, k, v, rows


def _dynamo_graph(fn, *args) -> tuple[fx.GraphModule, list]:
    """Dynamo's graph of `fn` and its inputs (in the graph's own order)."""
    graphs: list[tuple[fx.GraphModule, list]] = []

    def record(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm

    torch.compile(fn, backend=record)(*args)
    (graph,) = graphs
    return graph


def _mask_of(gm: fx.GraphModule) -> fx.Node:
    (call,) = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is SDPA]
    return call.kwargs["attn_mask"]


def test_a_mask_with_a_strided_last_dim_is_made_contiguous_on_the_devices_given():
    q, k, v, rows = _inputs("cpu")
    gm, inputs = _dynamo_graph(strided_mask_attention, q, k, v, rows)
    assert densify_attention_masks(gm) == 0  # CUDA only by default: these are CPU tensors
    assert _mask_of(gm).meta["example_value"].stride()[-1] == 0
    assert densify_attention_masks(gm, devices=("cpu",)) == 1
    dense = _mask_of(gm)
    assert (dense.op, dense.target) == ("call_method", "contiguous")
    assert dense.meta["example_value"].is_contiguous() and dense.meta["example_value"].dtype == torch.bool
    (call,) = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is SDPA]
    (zeroed,) = call.users  # every user now reads the output with fully masked rows zeroed
    assert zeroed.target is torch.where and zeroed.args[0].target == "any"
    torch.testing.assert_close(gm(*inputs)[0], strided_mask_attention(q, k, v, rows))
    assert densify_attention_masks(gm, devices=("cpu",)) == 0  # already dense


def test_dense_masks_and_calls_without_a_mask_are_left_alone():
    q, k, v, rows = _inputs("cpu")
    dense = rows[None, None, :, None].expand(2, 1, 16, 16).contiguous()
    for fn, args in [(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), (q, k, v, dense)),
                     (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v))]:
        gm, _ = _dynamo_graph(fn, *args)
        before = gm.code
        assert densify_attention_masks(gm, devices=("cpu",)) == 0 and gm.code == before


def test_compiled_attention_with_a_strided_mask_matches_eager_and_runs_fused_on_cuda():
    """Through the backend (fallback=False). On CUDA (KILN_INTEGRATION_TEST_DEVICE=cuda) the
    attention is a fused extern, not the math fallback's matmuls; on CPU the graph is unchanged."""
    device = torch.get_default_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v, rows = _inputs(device, dtype)
    options = KilnOptions.create({"fallback": False})
    reports: list[GraphReport] = []
    torch._dynamo.reset()
    compiled = torch.compile(strided_mask_attention,
                             backend=lambda gm, example_inputs: _compile(gm, example_inputs, options, reports.append))
    with torch.no_grad():
        got = compiled(q, k, v, rows)
    (report,) = reports
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got, strided_mask_attention(q, k, v, rows), **tolerance)
    lowered = " ".join(report.lowered_nodes)
    if device.type == "cuda":
        assert any(op in lowered for op in FUSED), report.lowered_nodes
        assert "bmm" not in lowered, report.lowered_nodes


def row_masked_attention(q, k, v, pattern):
    """A (L, S) mask read transposed (last stride L) and expanded over batch and heads: some
    query rows fully masked, others partly."""
    mask = pattern.t()[None, None].expand(q.shape[0], 1, q.shape[2], k.shape[2])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _row_pattern(device=None):
    pattern = torch.rand(16, 16, generator=torch.Generator().manual_seed(1), device="cpu").to(device) > 0.4  # (S, L)
    pattern[:, 3] = False  # query row 3: every key masked
    pattern[:, 7] = False
    pattern[0, :] = True
    pattern[0, 3] = pattern[0, 7] = False
    return pattern


def test_training_graphs_get_an_additive_mask_with_the_fallbacks_values():
    q, k, v, _ = _inputs("cpu")
    pattern = _row_pattern("cpu")
    gm, inputs = _dynamo_graph(row_masked_attention, q, k, v, pattern)
    assert densify_attention_masks(gm, devices=("cpu",), additive=True) == 1
    bias = _mask_of(gm)
    assert bias.target is additive_mask and bias.args[1] == torch.float32
    assert bias.meta["example_value"].dtype == torch.float32 and bias.meta["example_value"].is_contiguous()
    got, want = gm(*inputs)[0], row_masked_attention(q, k, v, pattern)
    torch.testing.assert_close(got, want)
    assert (got[:, :, 3] == 0).all() and (got[:, :, 7] == 0).all()  # fully masked rows: zeros, as the fallback's
    values = additive_mask(torch.tensor([True, False]), torch.bfloat16)
    assert values.tolist() == [0.0, torch.finfo(torch.bfloat16).min] and values.dtype == torch.bfloat16


def test_compiled_training_with_fully_masked_rows_keeps_eager_gradients():
    """Through the backend (fallback=False), forward and backward: the output and the gradients
    of q, k and v are eager's (the math fallback's), fully masked rows included. On CUDA
    (KILN_INTEGRATION_TEST_DEVICE=cuda) the attention and its backward are fused externs."""
    device = torch.get_default_device()
    q, k, v, _ = _inputs(device)
    pattern = _row_pattern(device)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = [t.clone().requires_grad_() for t in (q, k, v)]
    options = KilnOptions.create({"fallback": False})
    reports: list[GraphReport] = []
    torch._dynamo.reset()
    compiled = torch.compile(row_masked_attention,
                             backend=lambda gm, example_inputs: _compile(gm, example_inputs, options, reports.append))
    weights = torch.randn(2, 4, 16, 8, generator=torch.Generator().manual_seed(2), device="cpu").to(device)
    got = compiled(*leaves, pattern)
    (got * weights).sum().backward()
    want = row_masked_attention(*reference, pattern)
    (want * weights).sum().backward()
    assert reports, "kiln was never called"
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    for mine, theirs in zip(leaves, reference):
        assert torch.isfinite(mine.grad).all()
        torch.testing.assert_close(mine.grad, theirs.grad, atol=2e-5, rtol=2e-5)
    if device.type == "cuda":
        lowered = " ".join(name for report in reports for name in report.lowered_nodes)
        assert "_scaled_dot_product_efficient_attention_backward" in lowered, lowered
        assert "bmm" not in lowered, lowered


def test_float32_masks_stay_strided_where_float32_matmuls_may_use_tf32():
    """With TF32 allowed the math fallback's matmuls run on tensor cores and the fused kernels'
    float32 forms do not: float32 attention keeps its strided mask (tracing picks the fallback);
    16-bit attention is made dense as before."""
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        for dtype, changed in ((torch.float32, 0), (torch.bfloat16, 1)):
            q, k, v, rows = _inputs("cpu", dtype)
            for additive in (False, True):
                gm, _ = _dynamo_graph(strided_mask_attention, q, k, v, rows)
                assert densify_attention_masks(gm, devices=("cpu",), additive=additive) == changed, dtype
        torch.backends.cuda.matmul.allow_tf32 = False
        q, k, v, rows = _inputs("cpu")
        gm, _ = _dynamo_graph(strided_mask_attention, q, k, v, rows)
        assert densify_attention_masks(gm, devices=("cpu",)) == 1
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
