"""Large kernel outputs kept resident between calls.

A CPU output of at least `MIN_BYTES` comes from a pool of storages this process allocated
earlier, instead of a fresh allocation each call. Why: glibc hands out a large block by growing
its heap (or mapping it), and when the block is freed it may shrink the heap again (or unmap it);
the next call's output then faults in every 4 KiB page afresh. Whether that happens depends on
what the rest of the process allocated and freed in between (eager code between two compiled
calls, say), not on the kernel: on the 2-core VM of BENCHMARKS.md, writing 16 MiB took 0.6 ms into
resident pages and 5.2 ms into fresh ones, and the same rmsnorm kernel ran 1.0 ms or 6.5 ms per
call depending only on which eager calls came before it (`tools/output_faults.py`).

How: the pool keeps a reference to every storage it handed out, by byte size. A storage whose
only reference left is the pool's (torch's use count of the storage is 1) is free: the next
output of that byte size takes it, as a plain tensor (not a view) set on it. The pool holds at
most `max_bytes` in all (`KILN_CPU_OUTPUT_POOL_MB`, default 512; 0 turns it off): past that, free
storages go least recently used first, and when every pooled storage is in use the output is an
ordinary allocation. So the memory it keeps beyond what the program holds is at most the free
part of `max_bytes`; `release_output_pool()` drops the free ones
now. The storages are ordinary CPU storages: resizable, and an output keeps eager's sizes,
strides and byte size.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

# glibc's default mmap threshold: a block at least this large may be mapped afresh on every call
# (a channels-last conv's folded 147 KiB weights faulted in 77 pages a call, `conv_batch_norm.py`);
# smaller outputs come and go through malloc's bins and stay resident.
MIN_BYTES = 128 << 10
_DEFAULT_MAX_MB = 512
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _max_bytes_from_environment() -> int:
    text = os.environ.get("KILN_CPU_OUTPUT_POOL_MB", "").strip()
    if not text:
        return _DEFAULT_MAX_MB << 20
    try:
        megabytes = float(text)
    except ValueError:
        raise ValueError(f"KILN_CPU_OUTPUT_POOL_MB must be a number of MiB (0 turns the pool off), "
                         f"got {text!r}") from None
    return max(0, int(megabytes * (1 << 20)))


def byte_size(size: Sequence[int], stride: Sequence[int], itemsize: int) -> int:
    """The bytes a tensor of these sizes and strides spans (0 when it has no element)."""
    span = 1
    for extent, step in zip(size, stride):
        if extent == 0:
            return 0
        span += (extent - 1) * step
    return span * itemsize


class OutputPool:
    """See the module docstring. `allocate` is `fresh`'s signature: (size, stride, dtype)."""

    def __init__(self, fresh: Callable[[Any, Any, torch.dtype], torch.Tensor], max_bytes: int) -> None:
        self._fresh = fresh
        self.max_bytes = max_bytes if _USE_COUNT is not None else 0
        self._lock = threading.Lock()
        self._by_size: dict[int, list[torch.UntypedStorage]] = {}
        self._last_use: dict[int, int] = {}  # id(storage) -> tick of its last hand-out
        self._tick = 0
        self.held_bytes = 0
        self.reused = 0  # hand-outs of a pooled storage (tests and tools read these)
        self.added = 0

    def allocate(self, size: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
        nbytes = byte_size(size, stride, dtype.itemsize)
        if nbytes < MIN_BYTES or nbytes > self.max_bytes:
            return self._fresh(size, stride, dtype)
        with self._lock:
            storage = self._take(nbytes)
            if storage is None:
                if self.held_bytes + nbytes > self.max_bytes and not self._evict(nbytes):
                    return self._fresh(size, stride, dtype)
                storage = self._fresh((nbytes,), (1,), torch.uint8).untyped_storage()
                self._by_size.setdefault(nbytes, []).append(storage)
                self.held_bytes += nbytes
                self.added += 1
            else:
                self.reused += 1
            self._tick += 1
            self._last_use[id(storage)] = self._tick
            return self._fresh((0,), (1,), dtype).set_(storage, 0, size, stride)

    def _take(self, nbytes: int) -> torch.UntypedStorage | None:
        """The free pooled storage of `nbytes` bytes handed out last (the likeliest to be in
        cache still, as malloc reuses the block freed last); storages resized by their users are
        dropped. (Against the first free one in the order they were added: 1-2% faster per call
        for GPT-2 4L d256 4x128 and BERT in two interleaved runs, Llama equal; BENCHMARKS.md
        session 22.)"""
        bucket = self._by_size.get(nbytes)
        if not bucket:
            return None
        latest, latest_tick = None, -1
        for storage in list(bucket):
            if _USE_COUNT(storage._cdata) != 1:
                continue
            if storage.nbytes() != nbytes:  # resized since: no longer the size it is filed under
                self._drop(storage, nbytes)
                continue
            tick = self._last_use.get(id(storage), 0)
            if tick > latest_tick:
                latest, latest_tick = storage, tick
        return latest

    def _drop(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        self._by_size[nbytes].remove(storage)
        if not self._by_size[nbytes]:
            del self._by_size[nbytes]
        self._last_use.pop(id(storage), None)
        self.held_bytes -= nbytes

    def _evict(self, wanted: int) -> bool:
        """Drop free storages, least recently used first, until `wanted` more bytes fit."""
        free = [(self._last_use.get(id(s), 0), nbytes, s) for nbytes, bucket in self._by_size.items()
                for s in bucket if _USE_COUNT(s._cdata) == 1]
        for _, nbytes, storage in sorted(free, key=lambda entry: entry[0]):
            if self.held_bytes + wanted <= self.max_bytes:
                break
            self._drop(storage, nbytes)
        return self.held_bytes + wanted <= self.max_bytes

    def release(self) -> int:
        """Drop every free pooled storage; returns the bytes released."""
        with self._lock:
            before = self.held_bytes
            for nbytes, bucket in list(self._by_size.items()):
                for storage in list(bucket):
                    if _USE_COUNT(storage._cdata) == 1:
                        self._drop(storage, nbytes)
            return before - self.held_bytes


def _empty_strided_cpu_dispatched(size: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_strided(size, stride, dtype=dtype, device="cpu")


# Allocates a CPU tensor without torch's dispatcher: about a quarter of the host time of
# torch.empty_strided(..., device="cpu") per output (the allocator Dynamo's own guards and
# Inductor's CPU wrappers use); torch's dispatcher on a torch without it.
EMPTY_STRIDED_CPU = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "_empty_strided_cpu",
                            _empty_strided_cpu_dispatched)

POOL = OutputPool(EMPTY_STRIDED_CPU, _max_bytes_from_environment())


def release_output_pool() -> int:
    """Free the pooled output storages no tensor uses (`kiln.codegen_cpp.release_output_pool`);
    returns the bytes released."""
    return POOL.release()
