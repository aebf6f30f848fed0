"""DDP python_reducer's per-gradient all-reduces merged into buckets (one collective each).

Graphs are traced with fake tensors; the bucketed graph then runs on a one-rank gloo group and
gives the original graph's values."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.integration._internal import comm_buckets

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
c10d = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def group_name():
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD.group_name
    dist.destroy_process_group()


def _reducer(group: str, sizes):
    def backward(*grads):
        results = []
        for grad in grads:  # as DDP's compiled_accum_grad_hook: grad / world, all_reduce, copy
            reduced = c10d.wait_tensor(c10d.all_reduce(grad * 0.5, "sum", group))
            results.append(reduced + 1)
        return results
    return backward, [torch.randn(*s) for s in sizes]


def _count(gm, op) -> int:
    return sum(1 for n in gm.graph.nodes if n.target == op.default)


def test_all_reduces_of_one_group_become_one_collective(group_name):
    fn, grads = _reducer(group_name, [(4, 3), (7,), (2, 2, 2)])
    gm = make_fx(fn, tracing_mode="fake")(*grads)
    expected = gm(*grads)
    assert _count(gm, c10d.all_reduce) == 3
    assert comm_buckets.bucket_all_reduces(gm) == 2
    assert _count(gm, c10d.all_reduce) == 1 and _count(gm, c10d.wait_tensor) == 1
    for got, want in zip(gm(*grads), expected):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


def test_a_result_used_before_the_next_gradient_exists_closes_the_bucket(group_name):
    def chained(a, b):
        first = c10d.wait_tensor(c10d.all_reduce(a, "sum", group_name))
        second = c10d.wait_tensor(c10d.all_reduce(b * first.sum(), "sum", group_name))  # needs `first`
        third = c10d.wait_tensor(c10d.all_reduce(b + 1, "sum", group_name))
        return first, second, third

    a, b = torch.randn(3), torch.randn(5)
    gm = make_fx(chained, tracing_mode="fake")(a, b)
    expected = gm(a, b)
    assert comm_buckets.bucket_all_reduces(gm) == 1  # second needs first (first stays alone); third joins second
    assert _count(gm, c10d.all_reduce) == 2
    for got, want in zip(gm(a, b), expected):
        torch.testing.assert_close(got, want)


def test_buckets_are_bounded_and_keep_dtypes_apart(group_name, monkeypatch):
    monkeypatch.setattr(comm_buckets, "BUCKET_BYTES", 64)  # 16 float32 values
    sizes = [(8,), (8,), (8,), (4,)]
    fn, grads = _reducer(group_name, sizes)
    grads.append(torch.randn(6, dtype=torch.float64))

    def with_double(*args):
        return fn(*args)

    gm = make_fx(with_double, tracing_mode="fake")(*grads)
    expected = gm(*grads)
    merged = comm_buckets.bucket_all_reduces(gm)
    # float32: [8, 8] and [8, 4] (64 bytes each); the float64 one alone
    assert merged == 2 and _count(gm, c10d.all_reduce) == 3
    for got, want in zip(gm(*grads), expected):
        torch.testing.assert_close(got, want)
