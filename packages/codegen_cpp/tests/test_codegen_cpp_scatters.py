"""Scatters whose columns never share a destination run over columns in parallel, scatters whose
source rows each write a block of their own over rows (`_internal/parallel_scatter_source.py`):
each thread walks every source row, in order, over its own columns, or its own rows, each in
order, so the results are the serial loop's (eager's order of accumulation) bit for bit."""

from __future__ import annotations

import pytest
import torch

MARK = "its own columns of every row"
ROW_MARK = "each thread scatters whole rows"


def _rows(seed: int = 0, rows: int = 300, columns: int = 37, vocab: int = 11):
    """Source rows, their destination rows (many repeats: sums of many terms, in order), the
    destination."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, columns, generator=gen), torch.randint(0, vocab, (rows,), generator=gen),
            torch.randn(vocab, columns, generator=gen))


def _embedding_grad(g, ids, base):
    return (base * 0).index_put((ids,), g, accumulate=True)


def _rows_of_planes(g, ids, base):  # [rows, 37] read as [rows, 1, 37]: 37 columns still
    return base[:, None].index_put((ids,), g[:, None] * 3, accumulate=True)


def _scatter_add_per_element(g, ids, base):  # each element's own destination row (dim 0)
    index = (ids[:, None] + (g > 0).long()) % base.shape[0]
    return base.scatter_add(0, index, g)


@pytest.mark.parametrize("fn", [_embedding_grad, _rows_of_planes, _scatter_add_per_element])
def test_row_scatters_run_over_columns_and_match_eager_bit_for_bit(cpp_parallel, threads, fn):
    compiled = cpp_parallel.build(fn, *_rows())
    assert MARK in compiled.source
    for seed in range(3):
        args = _rows(seed)
        assert torch.equal(compiled.module(*args), fn(*args))
    torch.set_num_threads(1)  # the serial loop: the same values
    assert torch.equal(compiled.module(*args), fn(*args))


@pytest.mark.parametrize("fn", [
    lambda g, ids, base: base.flatten().index_put((ids * 3,), g[:, 0], accumulate=True),
    lambda g, ids, base: base.index_put((ids, ids % base.shape[1]), g[:, 0], accumulate=True),
], ids=["elements", "two_indices"])
def test_scatters_whose_rows_and_columns_may_meet_stay_serial(cpp_parallel, threads, fn):
    args = _rows()
    compiled = cpp_parallel.build(fn, *args)
    assert MARK not in compiled.source and ROW_MARK not in compiled.source
    assert torch.equal(compiled.module(*args), fn(*args))


def _within_rows(seed: int = 0, rows: int = 300, width: int = 37, picks: int = 50):
    """A source of `rows` x `picks`, indices into rows of `width` (many repeats), the destination."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, picks, generator=gen), torch.randint(0, width, (rows, picks), generator=gen),
            torch.randn(rows, width, generator=gen))


@pytest.mark.parametrize("fn", [
    lambda src, index, base: base.scatter_add(1, index, src),
    lambda src, index, base: base.scatter_reduce(1, index, src * 3, "amax"),
    lambda src, index, base: torch.ops.aten.index_put(base, [None, index[0]], src, True),  # base[:, index] += src
    lambda src, index, base: base.scatter_add(1, index[:, :1], src[:, :1]),  # rows of one element
    lambda src, index, base: base[:, :, None].expand(-1, -1, 4).contiguous().scatter_add(
        1, index[:, :, None].expand(-1, -1, 4), src[:, :, None].expand(-1, -1, 4) * 3),  # r0 % 4 in the block
], ids=["scatter_add_dim_1", "scatter_reduce_amax", "index_put_trailing", "one_element_rows", "inner_dim_kept"])
def test_scatters_within_rows_run_over_rows_and_match_eager_bit_for_bit(cpp_parallel, threads, fn):
    compiled = cpp_parallel.build(fn, *_within_rows())
    assert ROW_MARK in compiled.source and MARK not in compiled.source
    for seed in range(3):
        args = _within_rows(seed)
        assert torch.equal(compiled.module(*args), fn(*args))
    torch.set_num_threads(1)  # the serial loop: the same values
    assert torch.equal(compiled.module(*args), fn(*args))


def test_an_index_out_of_range_raises_on_the_row_parallel_path(cpp_parallel, threads):
    src, index, base = _within_rows()
    fn = lambda src, index, base: base.scatter_add(1, index, src)  # noqa: E731
    compiled = cpp_parallel.build(fn, src, index, base)
    assert ROW_MARK in compiled.source
    index[250, 7] = 37
    with pytest.raises(IndexError):
        compiled.module(src, index, base)


def test_an_index_out_of_range_raises_on_the_parallel_path(cpp_parallel, threads):
    g, ids, base = _rows()
    compiled = cpp_parallel.build(_embedding_grad, g, ids, base)
    assert MARK in compiled.source
    ids[7] = 11
    with pytest.raises(IndexError):
        compiled.module(g, ids, base)


def test_no_parallel_scatter_without_openmp_or_below_the_threshold(cpp):
    args = _rows()
    assert MARK not in cpp.with_options(openmp=False).build(_embedding_grad, *args).source
    assert MARK not in cpp.build(_embedding_grad, *args).source  # 300 x 37 elements: serial
    assert MARK in cpp.build(_embedding_grad, *_rows(rows=2048, columns=64)).source


def test_the_row_and_column_are_named_so_row_work_leaves_the_column_loop(cpp_parallel):
    """A deterministic guard of the parallel path's speed: the destination row's index (and its
    check) reads `kiln_q`, the row, and the destination `kiln_c`, the column, not r0 / C and
    r0 % C, which GCC cannot prove invariant in the column loop (the column loop then becomes
    a plain add over contiguous columns: 2.16 -> 1.21 ms for 2048 rows of 512 into 8192, 2
    threads, session 21)."""
    source = cpp_parallel.build(_embedding_grad, *_rows()).source
    start = source.index(MARK)
    parallel = source[start:source.index("return;", start)]
    assert "in_ids_1[kiln_q]" in parallel and "+ kiln_c)]" in parallel, parallel
    assert "r0 / 37" not in parallel and "r0 % 37" not in parallel


@pytest.mark.parametrize("shape, dim", [((6, 40, 5), 1), ((6, 5, 40), 2), ((3, 4, 40, 2), 2), ((3, 4, 5, 40), 3),
                                        ((40, 6, 5), 0), ((3, 40, 4, 2), 1)])
def test_scatter_add_along_any_dim_is_eager_bit_for_bit(cpp_parallel, threads, shape, dim):
    """scatter_add along each dim of 3-d and 4-d tensors (sources half as long along `dim`, many
    repeated indices): whichever loop the kernel takes (rows, columns or serial), eager's values
    bit for bit, with 4 threads and with 1."""
    def fn(src, index, base):
        return base.scatter_add(dim, index, src)

    def args(seed):
        gen = torch.Generator().manual_seed(seed)
        small = list(shape)
        small[dim] //= 2
        return (torch.randn(*small, generator=gen), torch.randint(0, 7, small, generator=gen),
                torch.randn(*shape, generator=gen))

    compiled = cpp_parallel.build(fn, *args(0))
    assert (ROW_MARK in compiled.source) == (dim > 0)  # dim 0 has no row of its own
    for seed in range(3):
        assert torch.equal(compiled.module(*args(seed)), fn(*args(seed)))
    torch.set_num_threads(1)
    assert torch.equal(compiled.module(*args(0)), fn(*args(0)))


def test_the_row_parallel_scatter_names_its_row(cpp_parallel):
    """A deterministic guard of the row path: the destination block reads `kiln_q`, the row each
    thread owns, not r0 / J recomputed for every element."""
    source = cpp_parallel.build(lambda src, index, base: base.scatter_add(1, index, src), *_within_rows()).source
    start = source.index(ROW_MARK)
    parallel = source[start:source.index("return;", start)]
    assert "(37 * kiln_q)" in parallel and "(r0 / 50)" not in parallel
