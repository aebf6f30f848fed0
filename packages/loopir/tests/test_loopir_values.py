"""Loop bodies are data: recorded once, replayed by every handler; kernels and kernel graphs are
values (equal lowerings compare equal and hash alike, any change to what they compute does not)."""

from __future__ import annotations

import collections

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import ComputedBuffer, Pointwise, lower, verify
from kiln.loopir._internal import ir
from kiln.loopir._internal.body import Constant, LoopBody, record
from kiln.loopir._internal.ops import Printer, ReadsWrites


def _block(x, w, idx):
    h = x @ w
    h = h * torch.sigmoid(h)
    centered = h - h.mean(-1, keepdim=True)
    h = centered * torch.rsqrt((centered * centered).mean(-1, keepdim=True) + 1e-5)
    e = (h - h.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True) + h.index_select(0, idx).sum(0)


def _args():
    torch.manual_seed(0)
    return torch.randn(8, 16), torch.randn(16, 32), torch.tensor([0, 3, 7])


def _lowered(fn=_block, args=None):
    return lower(make_fx(fn)(*(args or _args())))


def test_same_graph_lowered_twice_gives_equal_kernels_with_equal_hashes():
    first, second = _lowered(), _lowered()
    assert first.kernels and first.kernels == second.kernels
    assert [hash(k) for k in first.kernels] == [hash(k) for k in second.kernels]
    assert first == second and hash(first) == hash(second)
    assert first.kernels[0] is not second.kernels[0]  # values, not one cached object


@pytest.mark.parametrize(("a", "b"), [(1.0, 2.0), (0.0, -0.0), (2.0, 2.000001)])
def test_a_changed_constant_gives_different_kernels(a, b):
    x = torch.randn(4, 5)
    one, other = _lowered(lambda x: x * a + 1, (x,)), _lowered(lambda x: x * b + 1, (x,))
    assert one.kernels != other.kernels and one != other
    assert hash(one.kernels[0]) != hash(other.kernels[0])


def test_nan_constants_compare_equal():
    x = torch.randn(4, 5)
    one = _lowered(lambda x: torch.where(x > 0, x, float("nan")), (x,))
    other = _lowered(lambda x: torch.where(x > 0, x, float("nan")), (x,))
    assert one.kernels == other.kernels and hash(one) == hash(other)
    assert Constant(float("nan")) == Constant(float("nan")) and Constant(0.0) != Constant(-0.0)
    assert Constant(1) != Constant(1.0) and Constant(True) != Constant(1)


def test_changed_shape_or_tensor_constant_gives_a_different_kernel_graph():
    x = torch.randn(4, 5)
    assert _lowered(lambda x: x.exp(), (x,)) != _lowered(lambda x: x.exp(), (torch.randn(4, 6),))
    c1, c2 = torch.ones(5), torch.ones(5)
    c2[3] = 2.0
    one = lower(make_fx(lambda x: x + c1)(x))
    other = lower(make_fx(lambda x: x + c2)(x))
    assert any(n.op == "get_attr" for n in one.gm.graph.nodes)
    assert one.kernels == other.kernels and one != other  # only the constant's content differs


def test_each_body_is_traced_once_whatever_runs_it(monkeypatch):
    traced = collections.Counter()
    real_record = ir.record

    def counting_record(inner_fn, *sizes):
        def counted(*args):
            traced[id(inner_fn)] += 1
            return inner_fn(*args)
        return real_record(counted, *sizes)

    monkeypatch.setattr(ir, "record", counting_record)
    kg = _lowered()
    verify(kg)
    for kernel in kg.kernels:
        str(kernel)
        for node in kernel.nodes:
            kernel.accesses(node)
            node.accesses()
    torch.testing.assert_close(kg(*_args()), _block(*_args()))
    nodes = [n for k in kg.kernels for n in k.nodes]
    assert len(traced) == len(nodes) and set(traced.values()) == {1}


def test_a_body_is_a_readable_ssa_record():
    kg = _lowered(lambda x: (x.exp() + 1).sum(-1), (torch.randn(4, 5),))
    (kernel,) = kg.kernels
    (node,) = kernel.nodes
    body = node.body.loop_body
    assert isinstance(body, LoopBody) and (body.n_index, body.n_rindex) == (1, 1)
    text = str(body)
    assert text.splitlines()[0] == "t0 = load(x_1, 5*i0 + r0)"
    assert "constant(1.0, float32)" in text and text.endswith("return t3")


def test_replay_substitutes_variables_simultaneously_and_indirect_symbols():
    def inner(ops, index):
        pos = ops.indirect_indexing(ops.load("idx", index[1]), 7)
        return ops.add(ops.load("x", 7 * index[0] + index[1]), ops.load("y", pos))

    body = record(inner, 2)
    i0, i1 = sympy.symbols("i0 i1", integer=True, nonnegative=True)
    seen = ReadsWrites()
    body.replay(seen, (i1, i0))  # swapped: a simultaneous substitution keeps them apart
    assert [(a.buffer, a.index) for a in seen.reads] == [("idx", i0), ("x", 7 * i1 + i0),
                                                       ("y", sympy.Symbol("ind0", integer=True))]
    printer = Printer()
    body.replay(printer, (i0, sympy.Integer(2)))
    assert printer.lines[0] == "t0 = load(idx, 2)" and "load(y, ind0)" in printer.lines[3]


def test_a_body_that_passes_something_else_to_an_op_is_refused():
    with pytest.raises(TypeError, match="bodies may pass values, index expressions"):
        record(lambda ops, index: ops.load("x", [index[0]]), 1)
    with pytest.raises(TypeError, match="not a value computed with ops"):
        record(lambda ops, index: 1.0, 1)


def test_hand_built_nodes_record_their_body_and_compare_by_it():
    spec = ir.BufferSpec.contiguous("buf0", torch.float32, (4,))

    def node(fn):
        return ComputedBuffer(spec, Pointwise((4,), fn, torch.float32))

    same_a = node(lambda ops, i: ops.exp(ops.load("x", i[0])))
    same_b = node(lambda ops, i: ops.exp(ops.load("x", i[0])))
    other = node(lambda ops, i: ops.exp(ops.load("x", i[0] + 1)))
    assert same_a == same_b and hash(same_a) == hash(same_b) and same_a != other
