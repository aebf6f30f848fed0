"""Real graphs: Dynamo (Torch IR) and ATen graphs of a HF BERT built from a small config.

Partitioned with an "only pointwise" and a "no matmul" predicate; an attention pattern and
a linear+GELU pattern matched and replaced by equivalent computations. Every rewritten or
partitioned graph must still compute the model's outputs. Nothing is downloaded.
"""

from __future__ import annotations

import math
import operator

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.partition import (
    Pattern,
    Supported,
    check_replacement,
    match,
    partition,
    replace,
    supports_ops,
    supports_tags,
    verify,
)

transformers = pytest.importorskip(
    "transformers",
    reason="transformers is not installed: kiln-partition alone depends only on torch; "
    "the full environment (nox -s tests) runs these real-model tests",
)

aten = torch.ops.aten
BATCH, SEQ, HIDDEN, HEADS, FFN = 2, 8, 32, 2, 64
HEAD = HIDDEN // HEADS


@pytest.fixture(scope="module")
def bert():
    """(Dynamo GraphModule, its example inputs, its eager outputs)."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
        intermediate_size=FFN, max_position_embeddings=32, attn_implementation="eager",
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 64, (BATCH, SEQ))
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, 6:] = 0
    captured = []

    def capture(gm, example_inputs):
        captured.append((gm, list(example_inputs)))
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture, fullgraph=True)(input_ids=ids, attention_mask=mask)
    torch._dynamo.reset()
    ((gm, inputs),) = captured
    with torch.no_grad():
        expected = gm(*inputs)
    return gm, inputs, expected


def fresh_dynamo(bert) -> fx.GraphModule:
    gm, _, _ = bert
    return fx.GraphModule(gm, gm.graph.__deepcopy__())  # meta (example_value) is kept


def fresh_aten(bert) -> fx.GraphModule:
    gm, inputs, _ = bert
    with torch.no_grad():
        return make_fx(gm)(*inputs)


def assert_same_outputs(gm: fx.GraphModule, bert) -> None:
    _, inputs, expected = bert
    with torch.no_grad():
        got = gm(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


TORCH_POINTWISE = supports_ops(
    {operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, torch.tanh,
     F.gelu, torch.rsqrt, torch.exp, "to", "float"}
)
TORCH_MATMUL = supports_ops({torch.matmul, operator.matmul, F.linear, torch.bmm, torch.mm})
ATEN_MATMUL = supports_ops({aten.mm, aten.bmm, aten.addmm, aten.matmul, aten.linear})
CALLS = ("call_function", "call_method")


def calls_inside(out: fx.GraphModule) -> list[fx.Node]:
    return [
        n
        for sub in out.children()
        if isinstance(sub, fx.GraphModule)
        for n in sub.graph.nodes
        if n.op in CALLS
    ]


@pytest.mark.parametrize("ir", ["dynamo", "aten"])
def test_partition_only_pointwise(bert, ir):
    gm = fresh_dynamo(bert) if ir == "dynamo" else fresh_aten(bert)
    pointwise = TORCH_POINTWISE if ir == "dynamo" else supports_tags({torch.Tag.pointwise})
    out = partition(gm, pointwise)
    verify(out)
    inside = calls_inside(out)
    assert inside and all(pointwise(n) or n.target is operator.getitem for n in inside)
    report = out.meta["kiln_partition"]
    assert report.regions and report.unsupported
    assert {s.reason for s in report.splits} <= {"unsupported node", "cycle avoidance"}
    assert_same_outputs(out, bert)


@pytest.mark.parametrize("ir", ["dynamo", "aten"])
def test_partition_no_matmul(bert, ir):
    gm = fresh_dynamo(bert) if ir == "dynamo" else fresh_aten(bert)
    matmul = TORCH_MATMUL if ir == "dynamo" else ATEN_MATMUL
    out = partition(gm, ~matmul, min_size=2)
    verify(out)
    assert not any(matmul(n) for n in calls_inside(out))
    outside = [n for n in out.graph.nodes if n.op in CALLS and matmul(n)]
    assert len(outside) == sum(1 for n in gm.graph.nodes if n.op in CALLS and matmul(n)) > 0
    assert_same_outputs(out, bert)


def torch_attention(q, k, v, mask, scale):
    weights = torch.matmul(q, k.transpose(2, 3)) * scale
    weights = F.softmax(weights + mask, dim=-1)
    weights = F.dropout(weights, p=0.0, training=False)
    return torch.matmul(weights, v)


def sdpa(q, k, v, mask, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def linear_erf_gelu(x, w, b):
    y = F.linear(x, w, b)
    return 0.5 * y * (1.0 + torch.erf(y * (1.0 / math.sqrt(2.0))))


def test_dynamo_graph_attention_and_linear_gelu_match_and_replace(bert):
    gm = fresh_dynamo(bert)
    attention = match(gm, torch_attention)
    assert len(attention) == 2 and all(m.bindings["scale"] == HEAD**-0.5 for m in attention)
    assert len(match(gm, linear_gelu)) == 2
    assert len(replace(gm, torch_attention, sdpa)) == 2
    assert len(replace(gm, linear_gelu, linear_erf_gelu)) == 2
    gm.graph.lint()
    targets = [n.target for n in gm.graph.nodes]
    assert targets.count(F.scaled_dot_product_attention) == 2 and F.gelu not in targets
    assert_same_outputs(gm, bert)


def aten_attention(q, k, v, mask):
    weights = torch.matmul(q, k.transpose(2, 3)) * HEAD**-0.5
    return torch.matmul(torch.softmax(weights + mask, dim=-1), v)


def aten_sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=HEAD**-0.5)


def heads() -> torch.Tensor:
    # The layout the model produces: (batch, seq, heads, dim) viewed, then transposed.
    return torch.randn(BATCH, SEQ, HEADS, HEAD).transpose(1, 2)


def test_aten_graph_attention_and_linear_gelu_match_and_replace(bert):
    gm = fresh_aten(bert)
    example = (heads(), heads(), heads(), torch.randn(BATCH, 1, 1, SEQ))
    attention = Pattern(aten_attention, example)
    assert check_replacement(attention, aten_sdpa, example, atol=1e-5, rtol=1e-4)
    linear = Pattern(linear_gelu, (torch.randn(BATCH, SEQ, HIDDEN), torch.randn(FFN, HIDDEN), torch.randn(FFN)))
    assert [n.target for n in linear.nodes] == [
        aten.view.default, aten.t.default, aten.addmm.default, aten.view.default, aten.gelu.default
    ]
    assert len(match(gm, attention)) == 2 and len(match(gm, linear)) == 2
    assert len(replace(gm, attention, aten_sdpa)) == 2
    assert len(replace(gm, linear, linear_erf_gelu)) == 2
    gm.graph.lint()
    assert not any(n.target in (aten._softmax.default, aten.gelu.default) for n in gm.graph.nodes)
    assert all("val" in n.meta for n in gm.graph.nodes if n.op == "call_function")
    assert_same_outputs(gm, bert)


def test_replaced_graph_partitions_cleanly(bert):
    gm = fresh_aten(bert)
    example = (heads(), heads(), heads(), torch.randn(BATCH, 1, 1, SEQ))
    replace(gm, Pattern(aten_attention, example), aten_sdpa)
    no_attention = Supported(lambda n: "attention" not in str(n.target), "no attention")
    out = partition(gm, no_attention & ~ATEN_MATMUL)
    verify(out)
    assert_same_outputs(out, bert)
