"""Reductions over outer dims by blocks of output vectors (`_internal/vector_blocks.py`): the
reduction loops of OUTPUT_BLOCK output vectors jammed into one, so each row is read a block of
outputs at a time; the same results as one vector at a time, at every SIMD width."""

from __future__ import annotations

import re

import pytest
import torch

WIDTHS = [4, 16, 32, 64]
BLOCKED = "4 output vectors per block"


@pytest.fixture
def cpp(cpp):
    return cpp.with_options(vectorize=True)


def _columns(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = (torch.randn(rows, cols) * 2).round()
    x[3, 7], x[rows - 1, cols - 1] = float("nan"), float("nan")  # in a block, in the tail
    x[:, 100] = 1.5  # a column of ties
    return x, torch.randint(-3, 3, (rows, cols))


def _every_kind_over_dim0(x, n):
    centred = x - x.mean(0)
    return (x.sum(0), x.amax(0), x.double().amin(0), x.argmax(0), n.argmin(0), (x > 0).any(0), n.sum(0),
            (x * 0.25 + 1).prod(0), x.t().sum(-1), (centred * centred).mean(0))


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("cols", [1024 + 37, 2048])
def test_outer_dim_reductions_go_by_blocks_of_output_vectors_and_match_eager(cpp, width, cols):
    compiled = cpp.with_options(flags=(*cpp.options.flags, f"-DKILN_VECTOR_BYTES={width}")).check(
        _every_kind_over_dim0, *_columns(33, cols), rtol=1e-5, atol=1e-5)
    assert "// scalar loop" not in compiled.source, compiled.source
    assert BLOCKED in compiled.source, compiled.source


def test_one_row_loop_reads_the_whole_block(cpp):
    compiled = cpp.check(lambda x: x.sum(0), torch.randn(64, 2048))
    source = compiled.source
    block = source[source.index(BLOCKED):source.index("// vector code\n")]
    # one reduction loop in the block (in runs of 32 rows: float32 partial sums), holding the
    # loads of all four output vectors
    assert block.count("for (int64_t r0_run = 0; r0_run < 64; r0_run += 32)") == 1, block
    assert block.count("for (int64_t r0 = r0_run;") == 1, block
    loop = block[block.index("for (int64_t r0 = r0_run"):]
    loads = re.findall(r"kiln::load\(in_\w+ \+ \(i0_p(\d) \+ \(2048 \* r0\)\)", loop)
    assert loads == ["0", "1", "2", "3"], loop


def test_narrow_outputs_keep_one_vector_per_iteration(cpp):
    """64 channels are 4 AVX-512 vectors: one block would leave one thread all the work."""
    x = torch.randn(8, 64, 5, 5).contiguous(memory_format=torch.channels_last)
    compiled = cpp.check(lambda x: x.mean((0, 2, 3)), x)
    assert BLOCKED not in compiled.source
