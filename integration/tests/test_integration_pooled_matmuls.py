"""ATen matmuls of compiled CPU graphs write into codegen_cpp's resident output storages
(`pooled_matmuls.py`): eager's values, every matmul overload and keyword, results the caller
holds never written over, small outputs and dynamic shapes, and gradients."""

from __future__ import annotations

import pytest
import torch

from kiln.codegen_cpp._internal.output_pool import POOL
from kiln.integration import backend
from kiln.integration._internal import pipeline, pooled_matmuls

aten = torch.ops.aten


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def graphs(monkeypatch):
    """The code of every graph the pass rewrote, and how many matmuls it routed."""
    seen = []

    def spy(gm, codegen):
        routed = pooled_matmuls.pool_matmul_outputs(gm, codegen)
        seen.append((routed, gm.code))
        return routed

    monkeypatch.setattr(pipeline, "pool_matmul_outputs", spy)
    return seen


def _compile(fn, **kwargs):
    torch._dynamo.reset()
    calls = []

    def counting(gm, example_inputs):
        calls.append(1)
        return backend(gm, example_inputs, options={"fallback": False})

    compiled = torch.compile(fn, backend=counting, **kwargs)
    return compiled, calls


def _four_matmuls(x, w, b, p, q, c):
    h = torch.relu(x @ w)  # mm, read by a kiln kernel
    h = torch.addmm(b, h, w, beta=0.5, alpha=2.0).sigmoid()  # addmm with its keywords
    bb = torch.bmm(p, q).tanh()  # bmm
    bb = torch.baddbmm(c, bb, q, alpha=0.5).exp()  # baddbmm
    return h.sum(0), bb.sum(0)


def test_matmuls_take_pooled_outputs_with_eager_values(graphs):
    args = (_randn(256, 256), _randn(256, 256, seed=1) / 16, _randn(256, seed=2), _randn(4, 128, 128, seed=3),
            _randn(4, 128, 128, seed=4) / 12, _randn(4, 128, 128, seed=5))
    compiled, calls = _compile(_four_matmuls)
    with torch.no_grad():
        want = _four_matmuls(*args)
        compiled(*args)
        reused = POOL.reused
        for _ in range(2):
            got = compiled(*args)
    assert calls, "kiln was never called"
    assert [routed for routed, _ in graphs] == [4], graphs
    code = graphs[0][1]
    assert code.count("_into('cpu', ") == 4, code  # (the loop-level table makes baddbmm a bmm and an add)
    assert all(f"pooled_matmuls_{op}_into('cpu', " in code for op in ("mm", "addmm", "bmm")), code
    # each later call's four matmul outputs (256 KiB each) come back from the pool
    assert POOL.reused - reused >= 8
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_a_result_the_caller_holds_is_never_written_over():
    def f(x, w):
        return x @ w, torch.relu(x @ w.t())

    compiled, calls = _compile(f)
    w = _randn(256, 256, seed=9)
    x1, x2 = _randn(256, 256, seed=1), _randn(256, 256, seed=2)
    with torch.no_grad():
        first = compiled(x1, w)
        for seed in range(3, 6):
            compiled(_randn(256, 256, seed=seed), w)
        second = compiled(x2, w)
    assert calls
    for got, want in zip(first, f(x1, w)):
        torch.testing.assert_close(got, want)
    for got, want in zip(second, f(x2, w)):
        torch.testing.assert_close(got, want)
    assert first[0].untyped_storage().data_ptr() != second[0].untyped_storage().data_ptr()


def test_small_outputs_and_dynamic_shapes_keep_eager_values(graphs):
    def f(x, w):
        return torch.relu(x @ w) * 2

    compiled, calls = _compile(f, dynamic=True)
    w = _randn(64, 96, seed=3)
    with torch.no_grad():
        for rows in (8, 700, 33, 1500):  # 3 KiB to 576 KiB outputs: plain and pooled calls
            x = _randn(rows, 64, seed=rows)
            torch.testing.assert_close(compiled(x, w), f(x, w))
    assert calls
    assert graphs and all(routed == 1 for routed, _ in graphs), graphs


def test_gradients_through_pooled_matmuls_match_eager(graphs):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128))
    reference = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128))
    reference.load_state_dict(model.state_dict())
    x = _randn(256, 128)
    compiled, calls = _compile(model)
    for _ in range(2):
        model.zero_grad()
        compiled(x).square().mean().backward()
    reference(x).square().mean().backward()
    assert calls
    assert sum(routed for routed, _ in graphs) >= 4  # forward addmms, backward mms
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op, args, kwargs", [
    (aten.mm.default, ((256, 192), (192, 320)), {}),
    (aten.addmm.default, ((320,), (256, 192), (192, 320)), {"beta": 0.25, "alpha": 3.0}),
    (aten.bmm.default, ((3, 128, 64), (3, 64, 200)), {}),
    (aten.baddbmm.default, ((3, 128, 200), (3, 128, 64), (3, 64, 200)), {"alpha": -1.0}),
])
def test_each_matmul_writes_the_allocated_tensor(monkeypatch, op, args, kwargs):
    handed = []

    def allocate(size, stride, dtype):
        handed.append(torch.empty_strided(size, stride, dtype=dtype))
        return handed[-1]

    monkeypatch.setitem(pooled_matmuls._ALLOCATORS, "test", allocate)
    tensors = [_randn(*shape, seed=i) for i, shape in enumerate(args)]
    tensors[-1] = tensors[-1].mT.contiguous().mT  # a transposed operand: the output stays contiguous
    got = pooled_matmuls._MATMULS[op]("test", *tensors, **kwargs)
    want = op(*tensors, **kwargs)
    assert len(handed) == 1 and got.data_ptr() == handed[0].data_ptr()
    assert got.stride() == want.stride() == handed[0].stride()
    torch.testing.assert_close(got, want)
    # 8 rows of the first matrix (and of a bias with rows): below MIN_BYTES, a plain call
    rows = {len(tensors) - 2} | ({0} if len(tensors) == 3 and tensors[0].dim() > 1 else set())
    small = [t[..., :8, :] if i in rows else t for i, t in enumerate(tensors)]
    got = pooled_matmuls._MATMULS[op]("test", *small, **kwargs)
    assert len(handed) == 1
    torch.testing.assert_close(got, op(*small, **kwargs))


def test_without_a_pool_matmuls_call_torchs_bindings(graphs):
    """A codegen without `allocate_output` (codegen_triton; here under Triton's interpreter) gets
    each matmul as torch's C binding (`torch.mm`, ...), not `OpOverload.__call__`: eager's values."""
    args = (_randn(16, 16), _randn(16, 16, seed=1) / 4, _randn(16, seed=2), _randn(2, 8, 8, seed=3),
            _randn(2, 8, 8, seed=4) / 3, _randn(2, 8, 8, seed=5))
    torch._dynamo.reset()
    calls = []

    def counting(gm, example_inputs):
        calls.append(1)
        return backend(gm, example_inputs, options={"fallback": False, "codegen": "cuda"})

    with torch.no_grad():
        got = torch.compile(_four_matmuls, backend=counting)(*args)
        want = _four_matmuls(*args)
    assert calls and sum(routed for routed, _ in graphs) == 4
    code = "\n".join(code for _, code in graphs)
    assert all(f"torch.{name}(" in code for name in ("mm", "addmm", "bmm"))  # (baddbmm: a bmm and an epilogue)
    assert "aten.mm" not in code and "mm_into" not in code
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", list(pooled_matmuls._DIRECT))
def test_direct_bindings_are_the_same_ops(op):
    shapes = {aten.mm.default: ((5, 3), (3, 4)), aten.addmm.default: ((4,), (5, 3), (3, 4)),
              aten.bmm.default: ((2, 5, 3), (2, 3, 4)), aten.baddbmm.default: ((2, 5, 4), (2, 5, 3), (2, 3, 4))}[op]
    tensors = [_randn(*shape, seed=i) for i, shape in enumerate(shapes)]
    kwargs = {"beta": 0.5, "alpha": -2.0} if op in (aten.addmm.default, aten.baddbmm.default) else {}
    assert torch.equal(pooled_matmuls._DIRECT[op](*tensors, **kwargs), op(*tensors, **kwargs))
