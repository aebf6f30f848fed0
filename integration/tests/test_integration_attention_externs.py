"""Fused attention ops are extern calls inside kiln's region (loopir `lower_attention.py`):
a transformer compiles to one region with no eager fallback, forward and backward."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import loopir
from kiln.integration import GraphReport, KilnOptions
from kiln.integration._internal.backend import _compile
from kiln.loopir._internal.lower_attention import ATTENTION_OPS

aten = torch.ops.aten
OPTIONS = {"fallback": False}


class Block(torch.nn.Module):
    """Projections, causal attention and a residual: the attention sits between kernels."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        y = F.scaled_dot_product_attention(torch.tanh(q), k, v, is_causal=True)
        return torch.layer_norm(x + self.out(y.transpose(1, 2).reshape(batch, seq, width)), (width,))


def _attention_calls(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target in ATTENTION_OPS]


def _recorded(fn, reports: list[GraphReport]):
    options = KilnOptions.create(OPTIONS)
    torch._dynamo.reset()
    return torch.compile(fn, backend=lambda gm, example_inputs: _compile(gm, example_inputs, options, reports.append))


def _attention_lowered(report: GraphReport) -> list[str]:
    return [op for op in report.lowered_nodes if "scaled_dot_product" in op]


def test_inference_is_one_region_with_the_attention_as_an_extern():
    torch.manual_seed(0)
    block, x = Block().eval(), torch.randn(2, 8, 32)
    reports: list[GraphReport] = []
    with torch.no_grad():
        got = _recorded(block, reports)(x)
        want = block(x)
    (report,) = reports
    assert report.fallback_nodes == () and report.kernels > 0 and report.externs >= 3  # qkv, attention, out
    assert _attention_lowered(report), report.lowered_nodes
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_training_gradients_match_eager_with_forward_and_backward_attention_externs():
    torch.manual_seed(0)
    block, x = Block(), torch.randn(2, 8, 32, requires_grad=True)
    reports: list[GraphReport] = []
    _recorded(block, reports)(x).square().mean().backward()
    got = [x.grad.clone()] + [p.grad.clone() for p in block.parameters()]
    assert [r.backward for r in reports] == [False, True]
    for report in reports:  # the forward's attention and the backward's attention backward
        assert report.fallback_nodes == () and _attention_lowered(report), report
    x.grad = None
    block.zero_grad()
    block(x).square().mean().backward()
    want = [x.grad] + [p.grad for p in block.parameters()]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_lowering_keeps_one_call_and_buffers_only_for_the_results_read():
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q * 2, k, v) + 1

    gm = make_fx(fn, tracing_mode="fake")(q, k, v)
    calls = _attention_calls(gm.graph)
    assert len(calls) == 1, gm.graph  # torch 2.11 and 2.13 trace the CPU flash op
    kernel_graph = loopir.lower(gm)
    (extern,) = kernel_graph.externs
    read = {u.args[1] for u in calls[0].users if u.target is operator.getitem}
    assert [i for i, spec in enumerate(extern.items) if spec is not None] == sorted(read)
    torch.testing.assert_close(kernel_graph.gm(q, k, v), fn(q, k, v))


def test_a_symbolic_result_read_by_a_later_op_keeps_the_node_out_of_loopir():
    graph = fx.Graph()
    node = graph.call_function(aten._scaled_dot_product_flash_attention_for_cpu.default, ())
    node.meta["val"] = (torch.empty(1), object())
    graph.call_function(operator.getitem, (node, 0))
    assert loopir.lowerable(node)
    graph.call_function(operator.getitem, (node, 1))
    assert not loopir.lowerable(node)  # an object that is neither a tensor nor an int


def test_dynamic_shapes_training_matches_eager_at_two_sequence_lengths():
    """Under dynamic shapes the attention stays one extern call (on a GPU its max sequence
    lengths are symbolic results the backward reads: that node then stays with eager)."""
    torch.manual_seed(0)
    block = Block()
    reports: list[GraphReport] = []
    compiled = _recorded(block, reports)
    for seq in (8, 12):
        x = torch.randn(2, seq, 32, requires_grad=True)
        torch._dynamo.mark_dynamic(x, 1)
        compiled(x).square().mean().backward()
        got = [x.grad.clone()] + [p.grad.clone() for p in block.parameters()]
        x.grad = None
        block.zero_grad()
        block(x).square().mean().backward()
        want = [x.grad] + [p.grad for p in block.parameters()]
        block.zero_grad()
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert len(reports) == 2 and all(r.compiled and r.kernels > 0 for r in reports)  # one dynamic graph


def test_a_training_output_viewing_an_attention_result_read_again_can_be_modified_in_place():
    """The attention's result is a view returned and also read by a kernel: in training the
    returned view is a copy of its own (an autograd.Function's output modified in place)."""
    def fn(q, k, v):
        y = F.scaled_dot_product_attention(q, k, v)
        return y.transpose(1, 2), (y * 2).sum()

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 16, requires_grad=True) for _ in range(3))
    reports: list[GraphReport] = []
    view, total = _recorded(fn, reports)(q, k, v)
    assert reports[0].fallback_nodes == () and _attention_lowered(reports[0])
    want_view, want_total = fn(q, k, v)
    torch.testing.assert_close(view, want_view)
    assert view.stride() == want_view.stride()
    view.add_(1)  # an error if it were a view created inside the custom Function
    (view.sum() + total).backward()
    got = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want_view = want_view.clone().add_(1)
    (want_view.sum() + want_total).backward()
    for g, t in zip(got, (q, k, v)):
        torch.testing.assert_close(g, t.grad, rtol=1e-4, atol=1e-5)

