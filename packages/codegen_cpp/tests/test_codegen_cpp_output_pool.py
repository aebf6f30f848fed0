"""Large outputs come from a pool of resident storages (`_internal/output_pool.py`): a storage is
handed out again only once no tensor uses it, never to two live tensors; outputs keep eager's
sizes, strides and byte size and are not views; the pool stays under its byte cap."""

from __future__ import annotations

import resource
import threading

import pytest
import torch

from kiln import codegen_cpp
from kiln.codegen_cpp._internal import output_pool
from kiln.codegen_cpp._internal.output_pool import MIN_BYTES, OutputPool

ROWS, COLS = 512, 1024  # 2 MiB of float32: pooled


def _fresh(size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype)


def _pool(max_bytes: int = 64 << 20) -> OutputPool:
    return OutputPool(_fresh, max_bytes)


def test_a_freed_output_is_reused_and_a_live_one_never_is():
    pool = _pool()
    first = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)
    address = first.data_ptr()
    second = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)
    assert second.data_ptr() != address  # `first` is alive
    view = first[3:]
    del first
    third = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)
    assert third.data_ptr() not in (address, second.data_ptr())  # a view keeps it alive
    del view
    fourth = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)
    assert fourth.data_ptr() == address and pool.reused == 1 and pool.added == 3


def test_the_free_storage_handed_out_last_is_reused_first():
    """Of several free storages of one size, the one handed out last (the likeliest still in
    cache) goes first; then the one before it."""
    pool = _pool()
    outputs = [pool.allocate((ROWS, COLS), (COLS, 1), torch.float32) for _ in range(3)]
    addresses = [out.data_ptr() for out in outputs]
    del outputs
    again = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)
    assert again.data_ptr() == addresses[2]
    second = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)
    assert second.data_ptr() == addresses[1]  # `again` (the last) is alive
    del second
    assert pool.allocate((ROWS, COLS), (COLS, 1), torch.float32).data_ptr() == addresses[1]
    assert pool.reused == 3 and pool.added == 3


def test_outputs_keep_eager_layout_and_are_no_views():
    pool = _pool()
    for size, stride, dtype in [((ROWS, COLS), (1, ROWS), torch.float32), ((4, 64, 32, 32), (65536, 1, 2048, 64),
                                                                          torch.float64)]:
        for _ in range(2):  # the second is a reuse
            out = pool.allocate(size, stride, dtype)
            expected = torch.empty_strided(size, stride, dtype=dtype)
            assert (out.shape, out.stride(), out.dtype, out.storage_offset()) == (
                expected.shape, expected.stride(), expected.dtype, 0)
            assert out.untyped_storage().nbytes() == expected.untyped_storage().nbytes()
            assert out._base is None and not out._is_view() and out.untyped_storage().resizable()
            del out
    assert pool.reused == 3  # the float64 output has the float32 one's byte size: it takes that storage


def test_small_outputs_and_outputs_over_the_cap_are_ordinary_allocations():
    pool = _pool(max_bytes=3 << 20)
    small = pool.allocate((MIN_BYTES // 8,), (1,), torch.float32)
    assert pool.added == 0 and small.numel() == MIN_BYTES // 8
    huge = pool.allocate((1 << 20,), (1,), torch.float32)  # 4 MiB > the cap
    assert pool.added == 0 and pool.held_bytes == 0
    a = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)  # 2 MiB
    b = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)  # would be 4 MiB held, a in use
    assert pool.added == 1 and pool.held_bytes == 2 << 20 and b.data_ptr() != a.data_ptr()
    del a, b, huge
    # a 1.5 MiB output evicts the free 2 MiB storage, least recently used first
    c = pool.allocate((3 << 19,), (1,), torch.uint8)
    assert pool.held_bytes == 3 << 19 and c.numel() == 3 << 19


def test_a_storage_resized_by_its_user_leaves_the_pool():
    pool = _pool()
    out = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)
    out.resize_(ROWS * 2, COLS)  # grows its storage in place
    del out
    again = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)
    assert pool.reused == 0 and pool.added == 2 and pool.held_bytes == ROWS * COLS * 4
    assert again.untyped_storage().nbytes() == ROWS * COLS * 4


def test_release_frees_only_unused_storages():
    pool = _pool()
    kept = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)
    pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)  # dropped at once
    assert pool.release() == ROWS * COLS * 4 and pool.held_bytes == ROWS * COLS * 4
    kept.fill_(1.0)
    assert kept.sum().item() == ROWS * COLS


def test_threads_never_share_a_live_storage():
    pool = _pool(max_bytes=256 << 20)
    errors: list[str] = []

    def work(seed: int) -> None:
        for step in range(200):
            out = pool.allocate((ROWS, COLS), (COLS, 1), torch.float32)
            out.fill_(seed)
            if not bool((out == seed).all()):
                errors.append(f"thread {seed} step {step}: another thread wrote this output")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    # each thread holds at most two outputs at once (the last one while it asks for the next)
    assert pool.reused > 0 and pool.held_bytes <= 8 * ROWS * COLS * 4


def test_environment_sets_the_cap(monkeypatch):
    monkeypatch.setenv("KILN_CPU_OUTPUT_POOL_MB", "0")
    assert output_pool._max_bytes_from_environment() == 0
    monkeypatch.setenv("KILN_CPU_OUTPUT_POOL_MB", "64")
    assert output_pool._max_bytes_from_environment() == 64 << 20
    monkeypatch.setenv("KILN_CPU_OUTPUT_POOL_MB", "lots")
    with pytest.raises(ValueError, match="KILN_CPU_OUTPUT_POOL_MB"):
        output_pool._max_bytes_from_environment()


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _only(result):
    return result[0] if isinstance(result, (tuple, list)) else result


def test_compiled_kernels_reuse_their_large_outputs_and_values_stay_right(cpp):
    """Through a compiled kernel (static and general paths): a freed output's pages are written
    again without faulting them in, a kept output is never overwritten by a later call."""
    compiled = cpp.check(lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                         torch.randn(ROWS, COLS), torch.randn(COLS), rtol=1e-5, atol=1e-5)
    x, w = torch.randn(ROWS, COLS), torch.randn(COLS)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    kept = _only(compiled.module(x, w))
    reused_before = output_pool.POOL.reused
    for _ in range(3):
        out = _only(compiled.module(torch.randn(ROWS, COLS), w))
        del out
    faults = 0
    for _ in range(5):
        before = _minor_faults()
        out = _only(compiled.module(x, w))
        faults += _minor_faults() - before
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        del out
    assert output_pool.POOL.reused - reused_before >= 7
    assert faults < ROWS * COLS * 4 // 4096  # fewer than one output's pages in five calls
    torch.testing.assert_close(kept, expected, rtol=1e-5, atol=1e-5)  # untouched by later calls
    assert codegen_cpp.release_output_pool() >= 0
