"""Streaming stores for outputs larger than half the last-level cache (`stream_stores.py`): which
outputs stream (checked on the generated source, not by timing), and eager's values at every
SIMD width, with tails and unaligned rows."""

from __future__ import annotations

import pytest
import torch

from kiln.codegen_cpp._internal import stream_stores

WIDTHS = [4, 16, 32, 64]  # as test_codegen_cpp_vector.py: no SIMD, SSE/NEON, AVX2, AVX-512


@pytest.fixture
def small_threshold(monkeypatch):
    """Stream outputs from 64 KiB, so tests use small tensors."""
    monkeypatch.setattr(stream_stores, "stream_min_bytes", lambda: 64 << 10)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _source(compiled) -> str:
    return compiled.module.meta["kiln_cpp"].source


def _inputs(rows, cols, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return torch.randn(rows, cols, generator=gen, dtype=dtype), torch.randn(cols, generator=gen, dtype=dtype)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("cols", [1024, 1001])  # rows start aligned / unaligned (then ordinary stores)
def test_large_outputs_stream_and_keep_eager_values(cpp, small_threshold, width, cols):
    compiled = cpp.with_options(flags=(*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}")).check(
        rmsnorm, *_inputs(96, cols), row_temporaries=True)
    source = _source(compiled)
    assert "kiln::store_stream(out_" in source and "kiln::store(out_" not in source
    assert source.count("kiln::stream_fence();") == 1


def test_pointwise_outputs_stream_too(cpp, small_threshold):
    x = _inputs(64, 1024)[0]
    compiled = cpp.check(lambda x: torch.sigmoid(x) * x + 1, x)
    assert "kiln::store_stream(out_" in _source(compiled)


def test_outputs_below_the_threshold_float64_or_of_unknown_size_do_not_stream(cpp, small_threshold):
    assert "store_stream(out_" not in _source(cpp.check(rmsnorm, *_inputs(8, 1024), row_temporaries=True))
    assert "store_stream(out_" not in _source(cpp.check(rmsnorm, *_inputs(96, 1024, torch.float64),
                                                         row_temporaries=True))
    symbolic = cpp.build(rmsnorm, *_inputs(96, 1024), tracing_mode="symbolic", row_temporaries=True)
    assert "store_stream(out_" not in _source(symbolic)


def test_an_output_the_kernel_reads_back_does_not_stream(cpp, small_threshold):
    compiled = cpp.build(rmsnorm, *_inputs(96, 1024), row_temporaries=True)
    (kernel,) = compiled.kernel_graph.kernels
    text = _source(compiled).replace("kiln::store_stream(", "kiln::store(")  # as generated, before streaming
    (name,) = stream_stores.streamed_outputs(kernel, text)
    reread = text + f"\n    auto again = kiln::load(out_{name} + 0, active);"
    assert stream_stores.streamed_outputs(kernel, reread) == []


def test_the_default_threshold_is_half_the_last_level_cache_and_at_least_16_mib(monkeypatch):
    assert stream_stores.stream_min_bytes() >= stream_stores.MIN_STREAM_BYTES
    monkeypatch.setattr(stream_stores, "last_level_cache_bytes", lambda: 256 << 20)
    assert stream_stores.stream_min_bytes() == 128 << 20
    monkeypatch.setattr(stream_stores, "last_level_cache_bytes", lambda: None)
    assert stream_stores.stream_min_bytes() == 16 << 20


def test_a_16_mib_rmsnorm_output_streams_by_default(cpp, monkeypatch):
    """The bench's rmsnorm 4096x1024 row (1.12 -> 0.83 ms when streamed, BENCHMARKS.md), on a
    host whose last-level cache is 32 MiB or less."""
    monkeypatch.setattr(stream_stores, "last_level_cache_bytes", lambda: 32 << 20)
    compiled = cpp.check(rmsnorm, *_inputs(4096, 1024), row_temporaries=True)
    assert "kiln::store_stream(out_" in _source(compiled)
