"""Scans (cumsum, cumprod, logcumsumexp, cummax/cummin): the serial loop and the parallel
two-pass scan over chunks (`_internal/parallel_scan_source.py`), against eager.

Tolerances: float32 sums, products and logaddexp accumulate in double on both paths, as
eager's CPU kernels do, so the serial loop is eager's bit for bit, and the chunked scan (which
reassociates the double sums) is held to 2 float32 ulp (eager's result, rounded once from a
double that differs by ~1e-16 relative); float64 to 1e-12 relative; cummax/cummin values and
positions, and integer scans, are exact on both paths.
"""

from __future__ import annotations

import re

import pytest
import torch

from kiln.codegen_cpp._internal.parallel_scan_source import MAX_CHUNKS, MIN_CHUNK

FLOAT32 = {"rtol": 2.4e-7, "atol": 1e-9}
FLOAT64 = {"rtol": 1e-12, "atol": 1e-12}

# Scanned lengths around the chunking: below it (serial), exactly two chunks, a short last
# chunk, three chunks, and the chunk count capped at MAX_CHUNKS (chunks longer than MIN_CHUNK).
SERIAL_LENGTHS = (1, 7, 2 * MIN_CHUNK - 1)
CHUNKED_LENGTHS = (2 * MIN_CHUNK, 2 * MIN_CHUNK + 1, 3 * MIN_CHUNK - 1, 3 * MIN_CHUNK,
                   MAX_CHUNKS * MIN_CHUNK + 3)


def _ties_and_nans(x):
    """Whole numbers (many ties) with NaNs, including NaNs at chunk boundaries."""
    y = torch.where(x.abs() > 2.2, float("nan"), (x * 2).round())
    for at in (MIN_CHUNK - 1, MIN_CHUNK, 2 * MIN_CHUNK + 1):
        if at < y.shape[-1] and y.shape[0] > 1:
            y[1, at] = float("nan")
    return y


def _float_scans(x):
    return x.cumsum(1), (1 + x * 1e-3).cumprod(1), (x * 3).logcumsumexp(1)


def _position_scans(y, x):
    return (*torch.cummax(y, 1), *torch.cummin(y, 1), *torch.cummax((x * 3).long(), 1))


@pytest.mark.parametrize("length", SERIAL_LENGTHS + CHUNKED_LENGTHS)
def test_scans_match_eager_on_both_paths(cpp_parallel, threads, length):
    torch.manual_seed(length)
    x = torch.randn(2, length)
    compiled = cpp_parallel.check(_float_scans, x, **FLOAT32)
    cpp_parallel.check(_position_scans, _ties_and_nans(x), x, rtol=0, atol=0)  # values and positions exact
    cpp_parallel.check(lambda x: x.cumsum(1), x.double(), **FLOAT64)
    chunked = "two passes over chunks" in compiled.source
    assert chunked == (length >= 2 * MIN_CHUNK), compiled.source


def test_scans_over_an_outer_dim_and_3d_rows(cpp_parallel, threads):
    """Strided scans (dim 0) and rows indexed by two outer loops, chunked."""
    x = torch.randn(3 * MIN_CHUNK + 5, 3)
    cpp_parallel.check(lambda x: (x.cumsum(0), *torch.cummax(x.round(), 0), x.logcumsumexp(0)), x, **FLOAT32)
    y = torch.randn(1, 3, 2 * MIN_CHUNK + 7)
    cpp_parallel.check(lambda y: (y.cumsum(-1), *torch.cummin(y.round(), -1)), y, **FLOAT32)


def test_the_chunked_path_runs_and_reassociates_float64(cpp_parallel, threads):
    """2^53 then ones: eager's serial double sum never moves (2^53 + 1 rounds back to 2^53);
    the chunked scan adds each later chunk's total (1024, exact) to it. The difference shows
    the chunked path ran (and is the reassociation its tolerance allows for)."""
    x = torch.ones(1, 4 * MIN_CHUNK, dtype=torch.float64)
    x[0, 0] = 2.0**53
    chunked = cpp_parallel.build(lambda x: x.cumsum(1), x).module(x)
    assert chunked[0, -1] - 2.0**53 >= 2 * MIN_CHUNK
    serial = cpp_parallel.with_options(openmp=False).build(lambda x: x.cumsum(1), x).module(x)
    assert torch.equal(serial, x.cumsum(1))
    torch.set_num_threads(1)  # one row, one thread: the serial loop
    assert torch.equal(cpp_parallel.build(lambda x: x.cumsum(1), x).module(x), x.cumsum(1))


def test_the_serial_scan_accumulates_float32_in_double_as_eager(cpp):
    """Over 30000 elements a float accumulator drifts by ~1e-2 from eager's double one."""
    x = torch.rand(4, 30000)
    compiled = cpp.with_options(openmp=False).build(lambda x: (x.cumsum(1), (x + 0.5).logcumsumexp(1)), x)
    assert "two passes over chunks" not in compiled.source
    for got, expected in zip(compiled.module(x), (x.cumsum(1), (x + 0.5).logcumsumexp(1))):
        assert torch.equal(got, expected)


def test_long_scans_over_few_rows_generate_the_parallel_path(cpp):
    """A deterministic guard: the long-scan kernel's source holds the two parallel passes (and
    the serial loop after them); short or many-row scans do not."""
    source = cpp.build(lambda x: x.cumsum(-1), torch.randn(2, 1 << 16)).source
    kernel = source[source.index('extern "C" void kernel0'):]
    assert "two passes over chunks" in kernel
    assert "kiln_rows < kiln_scan_threads()" in kernel
    assert len(re.findall(r"#pragma omp parallel for\n", kernel)) >= 2
    assert "#pragma omp simd reduction(+:acc_" in kernel  # pass 1's fold: GCC's vector code
    for fn, x in ((lambda x: x.cumsum(-1), torch.randn(8, 100)),
                  (lambda x: x.cumsum(-1), torch.randn(2048, 2048)),
                  (lambda x: x.cumsum(-1), torch.randn(2, 1 << 16))):
        options = {} if x.shape[0] != 2 else {"openmp": False}
        source = cpp.with_options(**options).build(fn, x).source
        assert "two passes over chunks" not in source


def test_chunked_scans_of_other_dtypes_and_dynamic_sizes(cpp_parallel, threads):
    """bfloat16 (stored rounded, accumulated in double), int64 and bool (exact), and sizes
    known only at run time: one library, chunked or serial as each call's sizes say."""
    x = torch.randn(2, 2 * MIN_CHUNK + 3)
    cpp_parallel.check(lambda x: x.bfloat16().cumsum(1), x, rtol=7.9e-3, atol=1e-5)  # one bfloat16 ulp
    cpp_parallel.check(lambda x: ((x * 10).long().cumsum(1), (x > 0).cumsum(1)), x, rtol=0, atol=0)
    calls = [(torch.randn(3, 4 * MIN_CHUNK + 1),), (torch.randn(1, 3),), (torch.randn(5, 2 * MIN_CHUNK),)]
    compiled = cpp_parallel.check(lambda x: (x.cumsum(1), *torch.cummin(x.round(), 1)), x, tracing_mode="symbolic",
                                  calls=calls, **FLOAT32)
    assert "two passes over chunks" in compiled.source
