"""`eliminate_common_subexpressions`: equal pure nodes merge; mutating, random and uninitialized
ones never do."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.decomp import eliminate_common_subexpressions

aten = torch.ops.aten


def _count(gm, op) -> int:
    return sum(n.target is op for n in gm.graph.nodes)


def test_equal_views_and_ops_merge_and_results_stay():
    def fn(x, w):
        h = x * 2
        return h.view(4, 6) @ w, h.view(4, 6) @ w.t().t(), (x * 2).sum()

    args = (torch.randn(2, 2, 6), torch.randn(6, 3))
    gm = make_fx(fn)(*args)
    assert _count(gm, aten.view.default) == 2 and _count(gm, aten.mul.Tensor) == 2
    merged = eliminate_common_subexpressions(gm.graph)
    gm.recompile()
    assert merged >= 2
    assert _count(gm, aten.view.default) == 1 and _count(gm, aten.mul.Tensor) == 1
    for got, want in zip(gm(*args), fn(*args)):
        torch.testing.assert_close(got, want)


def test_constants_of_different_types_do_not_merge():
    def fn(x):
        return x + 1, x + 1.0, x + True

    gm = make_fx(fn)(torch.arange(4))
    eliminate_common_subexpressions(gm.graph)
    assert _count(gm, aten.add.Tensor) == 3


def test_random_mutating_and_uninitialized_nodes_stay():
    def fn(x):
        a, b = torch.rand_like(x), torch.rand_like(x)
        e1, e2 = torch.empty_like(x), torch.empty_like(x)
        y = x.clone()
        y.add_(1)
        z = x.clone()
        z.add_(1)
        return a, b, e1.fill_(1), e2.fill_(2), y, z

    gm = make_fx(fn)(torch.randn(3))
    ops = (aten.rand_like.default, aten.empty_like.default, aten.add_.Tensor, aten.clone.default)
    before = {op: _count(gm, op) for op in ops}
    eliminate_common_subexpressions(gm.graph)
    gm.recompile()
    # the clones are equal, but each is written in place: merged, y and z would be one tensor
    assert {op: _count(gm, op) for op in ops} == before == dict.fromkeys(ops, 2)
    torch.manual_seed(0)
    got = gm(torch.ones(3))
    torch.testing.assert_close(got[4], torch.full((3,), 2.0))
    torch.testing.assert_close(got[5], torch.full((3,), 2.0))


def test_nodes_before_the_first_mutation_still_merge():
    def fn(x, out):
        a, b = x.exp(), x.exp()
        out.copy_(a + b)
        return x.exp()

    gm = make_fx(fn)(torch.randn(3), torch.empty(3))
    eliminate_common_subexpressions(gm.graph)
    assert _count(gm, aten.exp.default) == 2  # the two before copy_ merged, the one after stays


def test_equal_values_that_are_both_outputs_stay_two_tensors():
    """Eager returns two tensors; merged, they would alias (two parameters sharing a .grad)."""
    def grads(x):
        return torch.zeros(3), torch.zeros(3), (x * 2).view(3), (x * 2).view(3), x.exp() + x.exp()

    gm = make_fx(grads)(torch.randn(3))
    eliminate_common_subexpressions(gm.graph)
    gm.recompile()
    out = gm(torch.ones(3))
    assert out[0].data_ptr() != out[1].data_ptr() and out[2].data_ptr() != out[3].data_ptr()
    assert _count(gm, aten.exp.default) == 1  # not an output itself: still merged
