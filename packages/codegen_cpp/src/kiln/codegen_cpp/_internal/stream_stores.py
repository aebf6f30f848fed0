"""Streaming (non-temporal) stores for kernel outputs too large to stay in the last-level cache.

An ordinary store into a line not in cache first reads the line from memory (write-allocate),
so a kernel writing a large output moves its bytes twice. A streaming store (`_mm512_stream_ps`
and its AVX/SSE forms) writes full lines around the cache instead. Measured on the 2-core AVX-512
VM of BENCHMARKS.md (32 MiB L3), an rmsnorm over 4096x1024 float32 (16 MiB out): 1.12 -> 0.83 ms;
8192x1024: 2.56 -> 1.60 ms. The other side: the written values are not in cache for whoever reads
them next, which matters where they would have stayed there: at 4 MiB, a producer plus a consumer
took 0.51 ms with ordinary stores and 0.63 ms with streaming ones; at 8 MiB the same; at 16 MiB
and more streaming won (3.55 -> 3.26 ms, 5.68 -> 4.56 ms). So an output streams when it is at least
`stream_min_bytes()` (half the last-level cache, at least 16 MiB), has static sizes, is float32,
and the kernel never reads it back (its `out_` pointer appears only in stores).

The vector layer's `kiln::store_stream` streams full, aligned vectors and stores anything else
(a loop's tail, an unaligned row start) as usual; on hosts without SSE it is an ordinary store.
Ordering: a thread's streaming stores are flushed by any locked instruction it runs (x86), and
OpenMP's closing barrier runs them on every thread; the kernel ends with `kiln::stream_fence()`
(`sfence`) for the thread that returns.
"""

from __future__ import annotations

import functools
import math
import os
import re

import sympy
import torch

from kiln.loopir import Kernel

MIN_STREAM_BYTES = 16 << 20


@functools.cache
def last_level_cache_bytes() -> int | None:
    """The host's largest cache (Linux sysfs, else sysconf), in bytes; None when unknown."""
    sizes = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for entry in os.listdir(base):
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
    except (OSError, ValueError):
        pass
    if not sizes:
        for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
            try:
                value = os.sysconf(name)
            except (OSError, ValueError):
                continue
            if value > 0:
                sizes.append(value)
    return max(sizes) if sizes else None


def stream_min_bytes() -> int:
    """Outputs of at least this many bytes are written with streaming stores."""
    cache = last_level_cache_bytes()
    return max(MIN_STREAM_BYTES, cache // 2) if cache else MIN_STREAM_BYTES


def streamed_outputs(kernel: Kernel, text: str) -> list[str]:
    """The names of `kernel`'s outputs its function (`text`) should store with streaming stores."""
    limit = stream_min_bytes()
    chosen = []
    for out in kernel.outputs:
        if out.dtype != torch.float32 or not all(sympy.sympify(s).is_Integer for s in out.size):
            continue
        if math.prod(int(s) for s in out.size) * out.dtype.itemsize < limit:
            continue
        pointer = f"out_{out.name}"
        uses = len(re.findall(rf"\b{pointer}\b", text))
        stores = len(re.findall(rf"kiln::store\({pointer} \+ ", text))
        if stores and uses == stores + 1:  # the signature's parameter, then stores alone
            chosen.append(out.name)
    return chosen


def with_stream_stores(kernel: Kernel, lines: list[str]) -> list[str]:
    """`lines` (a kernel function, closing brace last) with its large outputs' vector stores
    streamed, and a fence before it returns; `lines` itself when nothing streams."""
    names = streamed_outputs(kernel, "\n".join(lines))
    if not names:
        return lines
    pattern = re.compile(r"kiln::store\((out_(?:" + "|".join(map(re.escape, names)) + r")) \+ ")
    out = [pattern.sub(r"kiln::store_stream(\1 + ", line) for line in lines[:-1]]
    comment = f"    // streaming stores for {', '.join(names)} (>= {stream_min_bytes() >> 20} MiB, never read back here)"
    return [out[0], out[1], comment, *out[2:], "    kiln::stream_fence();", lines[-1]]
