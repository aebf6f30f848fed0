"""Differential tests of reduction kernels: generated Triton vs eager (on the Triton
interpreter, or compiled for a GPU: see conftest.py)."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonOptions, compile, verify
from kiln.loopir import Reduction, lower
from kiln.loopir._internal import lower_split
from kiln.loopir.codegen import shared_reduction_loops

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    # Small blocks: several programs, several loop steps (float32 rows too), partly masked last
    # blocks.
    return TritonOptions(cache_dir=tmp_path_factory.mktemp("triton_cache"), reduction_xblock=4, rblock=8,
                        contiguous_rblock=8, float32_contiguous_rblock=8)


def check(fn, args, options, tracing_mode="real", **tolerances):
    kernel_graph = lower(make_fx(fn, tracing_mode=tracing_mode)(*args), fuse_rows=False)
    module = compile(kernel_graph, options)
    verify(module)
    _first = module(*args)  # compiles; on a GPU the call below launches through the direct launcher
    expected, got = fn(*args), module(*args)  # `_first` alive: fresh output memory
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, equal_nan=True, **tolerances)
    return module, kernel_graph


REDUCTIONS = {
    "sum_last": lambda x: x.sum(-1),
    "sum_middle": lambda x: x.sum(1),
    "sum_first_keepdim": lambda x: x.sum(0, keepdim=True),
    "sum_two_dims": lambda x: x.sum((0, 2)),
    "sum_all": lambda x: x.sum(),
    "amax_last": lambda x: torch.amax(x, -1),
    "amax_middle_keepdim": lambda x: torch.amax(x, 1, keepdim=True),
    "amin_middle": lambda x: torch.amin(x, 1),
    "mean_last": lambda x: x.mean(-1),
    "mean_middle": lambda x: x.mean(1),
    "mean_all": lambda x: x.mean(),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_matches_eager(name, options):
    check(REDUCTIONS[name], (torch.randn(5, 19, 6),), options)


def test_float64_sum_is_accurate(options):
    x = torch.randn(3, 100, dtype=torch.float64)
    check(lambda x: x.sum(1), (x,), options, rtol=1e-13, atol=1e-13)


def test_integer_and_bool_reductions(options):
    a = torch.randint(-1000, 1000, (6, 21))
    x = torch.randn(6, 21)
    check(lambda a, x: (a.sum(1), torch.amax(a, 1), torch.amin(a, 0), (x > 0).sum(1)), (a, x), options,
          rtol=0, atol=0)


def test_amax_propagates_nan(options):
    x = torch.randn(4, 20)
    x[1, 17] = float("nan")
    x[3, 0] = float("nan")
    check(lambda x: (torch.amax(x, 1), torch.amin(x, 1), x.sum(1)), (x,), options)


def test_fused_reductions_and_pointwise_share_one_kernel(options):
    def fn(x, y):
        # a well-conditioned denominator: summation order must not matter beyond rounding
        return (torch.sigmoid(x) * y + 1.0).sum(-1) / torch.exp(x).sum(-1) + x.mean(-1)

    module, kernel_graph = check(fn, (torch.randn(6, 11), torch.randn(6, 11)), options)
    assert len(kernel_graph.kernels) == 1
    source = module.meta["kiln_triton"].source
    assert source.count("@triton.jit") == 1
    # the three sums are independent: one loop over the row, which loads x and y once each
    assert source.count("for roffset in range(") == 1
    assert source.count("tl.load(in_x") == 1 and source.count("tl.load(in_y") == 1
    assert source.count("tl.store(") == 1


def test_softmax_over_several_kernels(options):
    def fn(x):
        e = torch.exp(x - torch.amax(x, -1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    check(fn, (torch.randn(7, 13),), options)


def test_reduction_of_a_view(options):
    x = torch.randn(9, 6)
    check(lambda x: (x.t()[1:5] * 2).sum(1), (x,), options)


def test_dynamic_shapes(options):
    def fn(x):
        return x.sum(1) + torch.amax(x, 1)

    kernel_graph = lower(make_fx(fn, tracing_mode="symbolic")(torch.randn(4, 9)), fuse_rows=False)
    module = compile(kernel_graph, options)
    for shape in [(4, 9), (3, 30), (11, 2)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(module(x), fn(x))


def test_sum_over_empty_dim_is_zero(options):
    check(lambda x: x.sum(1), (torch.randn(3, 0),), options)


def only_triton_kernel(fn, *args, options):
    module = compile(lower(make_fx(fn)(*args)), options)
    (kernel,) = [n.target for n in module.graph.nodes if type(n.target).__name__ == "TritonKernel"]
    return kernel


@pytest.mark.parametrize("fn, contiguous", [
    (lambda x: x.sum(-1), True),
    (lambda x: x.sum(), True),
    (lambda x: x.t().sum(0), True),  # the transposed view's rows are the last dim again
    (lambda x: x.sum(0), False),  # walks a column: stride 12
    (lambda x: x.t().sum(-1), False),
    (lambda x: x - x.amax(-1, keepdim=True), True),  # a reduction and a row node
])
def test_block_shapes_follow_memory_order(fn, contiguous, tmp_path):
    kernel = only_triton_kernel(fn, torch.randn(5, 12), options=TritonOptions(cache_dir=tmp_path))
    assert kernel.contiguous == contiguous
    # Defaults: strided reductions take up to 32 outer points (a run of the contiguous dim) and
    # a 512-element block; a contiguous one takes up to 16384 of a float32 row (4096 of a
    # narrower dtype's) and as many rows as keep the block within 1024 elements.
    work = [(16384, 1024), (16384, 13), (7, 300), (1, 10**6), (64, 4096)]
    expected = ([(1, 1024), (8, 16), (2, 512), (1, 16384), (1, 4096)] if contiguous
                else [(32, 16), (32, 16), (8, 64), (1, 128), (32, 16)])
    assert [kernel._reduction_blocks(x, r) for x, r in work] == expected
    # one warp per KiB of the float32 tile (strided: per 256 bytes, 8 bytes a thread), 2 to 16
    warps = [kernel._warps({"XBLOCK": x, "RBLOCK": r}) for x, r in expected]
    assert warps == ([4, 2, 4, 16, 16] if contiguous else [8, 8, 8, 2, 8])


def test_long_strided_chunks_of_narrow_dtypes_read_whole_lines(tmp_path):
    """A bfloat16 sum over dim 0: chunks of 1024 rows or more take 64 columns (128 bytes a row
    segment) and a 1024-element tile; shorter chunks keep float32's 32 x 16."""
    kernel = only_triton_kernel(lambda x: x.sum(0), torch.randn(5, 12, dtype=torch.bfloat16),
                                options=TritonOptions(cache_dir=tmp_path))
    assert not kernel.contiguous
    assert [kernel._reduction_blocks(x, r) for x, r in [(32768, 2048), (32768, 1024), (24576, 128), (7, 4096)]] \
        == [(64, 16), (64, 16), (32, 16), (8, 128)]
    assert kernel._warps({"XBLOCK": 64, "RBLOCK": 16}) == 8  # 2 KiB tile, a warp per 256 bytes


def test_rows_of_narrow_dtypes_are_read_in_shorter_steps(tmp_path):
    kernel = only_triton_kernel(lambda x: x.sum(-1), torch.randn(5, 12, dtype=torch.bfloat16),
                                options=TritonOptions(cache_dir=tmp_path))
    assert kernel._reduction_blocks(1, 10**6) == (1, 8192)  # float32 rows: up to 16384


def var_mean(x):
    """var_mean over the last dim as kiln's decomposition writes it (decomp's `_var_and_mean`,
    as in test_codegen_triton_welford.py): shifted by the row's first element, a sum, then the
    squared deviations from the mean."""
    values = x.float() - x.float()[:, :1]
    mean = values.mean(-1, keepdim=True)
    var = ((values - mean) * (values - mean)).sum(-1, keepdim=True) / (x.shape[-1] - 1)
    return var.squeeze(-1).to(x.dtype), (mean + x.float()[:, :1]).squeeze(-1).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_that_reread_rows_hold_whole_rows(dtype, tmp_path):
    """A variance's two loops over each row (a sum, then the squared deviations from the mean;
    nothing row-shaped stored): the whole row in one step (up to 16384 elements,
    whatever the dtype) with one warp per 2 KiB (2 to 8). Kernels that store rows (softmax,
    norms) and single-loop reductions keep the general rule."""
    options = TritonOptions(cache_dir=tmp_path)
    x = torch.randn(5, 12, dtype=dtype)
    module = compile(lower(make_fx(var_mean)(x), row_temporaries=True), options)  # the backend's lowering for GPUs
    (held,) = [n.target for n in module.graph.nodes if type(n.target).__name__ == "TritonKernel"]
    assert held._holds_rows and held.contiguous
    assert not only_triton_kernel(var_mean, x, options=options)._holds_rows  # its shifted row is stored
    size = torch.empty((), dtype=dtype).element_size()
    for rnumel in (1024, 4096, 16384, 10**6):
        xblock, rblock = held._reduction_blocks(64, rnumel)
        assert (xblock, rblock) == (1, min(rnumel, 16384))
        assert held._warps({"XBLOCK": xblock, "RBLOCK": rblock}) == max(2, min(8, rblock * size // 2048))
    stores_rows = only_triton_kernel(lambda x: x - x.amax(-1, keepdim=True), torch.randn(5, 12, dtype=dtype), options=options)
    one_loop = only_triton_kernel(lambda x: x.sum(-1), torch.randn(5, 12, dtype=dtype), options=options)
    for kernel in (stores_rows, one_loop):
        assert not kernel._holds_rows
        assert kernel._reduction_blocks(64, 10**6)[1] == (16384 if dtype == torch.float32 else 8192)
    x = torch.randn(3, 5000) * 3 + 10
    torch.testing.assert_close(compile(lower(make_fx(var_mean)(x), row_temporaries=True), options)(x), torch.var_mean(x, -1),
                               rtol=1e-5, atol=1e-4)


def test_contiguous_rows_with_default_blocks(tmp_path):
    options = TritonOptions(cache_dir=tmp_path)
    check(lambda x: (x.sum(-1), x.amax(-1), x.sum(0)), (torch.randn(9, 700),), options, rtol=1e-5, atol=1e-4)


def more_reductions(x, b):
    return (x.prod(1), x[:, :, :3].prod(), b.long().prod(0), x.max(), x.min(), b.any(), b.all(1), x.any((0, 1)),
            x.argmax(), x.argmin(1, keepdim=True), *torch.max(x, -1), *torch.min(x, 0), torch.argmin(x, -1),
            torch.argmax(torch.where(x == x, x * 3, 0).int(), 2))


@pytest.mark.parametrize("fuse_rows", [False, True])
def test_prod_any_all_and_arg_reductions(fuse_rows, options):
    """argmax/argmin: the first largest/smallest (the first NaN), ties and NaNs spread over
    several lanes and loop steps; max.dim/min.dim's values and indices in one kernel."""
    x = torch.randn(3, 4, 37)
    x[1, 2, 3] = x[1, 2, 30] = x[2, 1, 1] = float("nan")
    x[0, 0, :], x[0, 1, :], x[2, 2, ::5] = 3.0, float("-inf"), 9.0
    b = torch.rand(3, 4) > 0.3
    kernel_graph = lower(make_fx(more_reductions)(x, b), fuse_rows=fuse_rows)
    torch.testing.assert_close(compile(kernel_graph, options)(x, b), more_reductions(x, b), equal_nan=True)


@pytest.mark.parametrize("split", [False, True])
def test_sibling_reductions_join_with_this_codegens_capabilities(split, tmp_path, monkeypatch):
    """Three bias gradients of separate inputs (no shared reads), as the query, key and value
    projections' are: with this codegen's capabilities (sibling joins on since session 21) the
    three sums share one kernel; split (loopir's size thresholds lowered: 8 chunks of 128 rows),
    their partial sums share one kernel and their final sums another. Both match eager."""
    from kiln.codegen_triton import CODEGEN

    def grads(a, b, c):
        return tuple(t.transpose(1, 2).reshape(2, 512, 48).sum((0, 1)) for t in (a, b, c))

    if split:
        for name in ("MIN_ELEMENTS", "MIN_PROGRAM_ELEMENTS"):
            monkeypatch.setattr(lower_split, name, 1)
    args = tuple(torch.randn(2, 3, 512, 16, dtype=torch.float16) for _ in range(3))
    caps = CODEGEN.capabilities
    assert caps.join_sibling_reductions and caps.split_reductions
    kernel_graph = lower(make_fx(grads)(*args), split_reductions=split,
                         join_sibling_reductions=caps.join_sibling_reductions)
    reductions = [sum(isinstance(n.body, Reduction) for n in k.nodes) for k in kernel_graph.kernels]
    assert reductions == ([3, 3] if split else [3]), str(kernel_graph)
    got = compile(kernel_graph, TritonOptions(cache_dir=tmp_path))(*args)
    torch.testing.assert_close(got, grads(*args), rtol=1e-2, atol=1e-2)


# (float16, not bfloat16: Triton's interpreter truncates float32 -> bfloat16 casts; GPUs round)
@pytest.mark.parametrize("fn", [lambda x: x.sum(0), lambda x: x.half().amax(0), lambda x: x.sum()])
def test_split_reductions_run(fn, tmp_path):
    """loopir's split reductions (on for this codegen): the partials' kernel, then theirs."""
    x = torch.randn(8192, 40)
    kernel_graph = lower(make_fx(fn)(x), split_reductions=True)
    assert sum(isinstance(n.body, Reduction) for k in kernel_graph.kernels for n in k.nodes) == 2
    torch.testing.assert_close(compile(kernel_graph, TritonOptions(cache_dir=tmp_path))(x), fn(x),
                               rtol=1e-4, atol=1e-3)


def _split_small_scans(monkeypatch):
    """loopir's split thresholds lowered, so that a 1024-long row splits into 64 chunks."""
    monkeypatch.setattr(lower_split, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(lower_split, "MIN_CHUNK", 16)


@pytest.mark.parametrize("fn", [lambda x: torch.cumsum(x, 0), lambda x: torch.cumsum(x.double(), 0),
                                lambda x: torch.logcumsumexp(x * 10, 0)], ids=["cumsum", "cumsum_double", "logcumsumexp"])
def test_split_scans_run(fn, tmp_path, monkeypatch):
    """A cumsum of one row split as a long one is (loopir's split scans, on for this codegen;
    its thresholds lowered: the interpreter runs logcumsumexp's `tl.associative_scan` element by
    element): 64 chunk scans, a scan of the chunks' totals, then the combine."""
    _split_small_scans(monkeypatch)
    x = torch.randn(1024)
    kernel_graph = lower(make_fx(fn)(x), split_reductions=True)
    assert len(kernel_graph.kernels) == 3
    torch.testing.assert_close(compile(kernel_graph, TritonOptions(cache_dir=tmp_path))(x), fn(x),
                               rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
def test_split_cummax_cummin_run(op, tmp_path, monkeypatch):
    """A cummax/cummin of one row with ties, -inf and NaNs, split (loopir's thresholds lowered:
    the interpreter runs `tl.associative_scan` of pairs element by element) into 64 chunks:
    chunk scans of values and positions, scans of the chunks' last pairs, then the pair combine
    (eager's rule: the latest of equal values, the latest NaN)."""
    _split_small_scans(monkeypatch)
    x = torch.randint(-3, 4, (1024,)).float()
    x[:40] = float("-inf") if op is torch.cummax else float("inf")
    x[300], x[700], x[701] = float("nan"), float("nan"), float("nan")
    kernel_graph = lower(make_fx(lambda x: op(x, 0))(x), split_reductions=True)
    assert sum(n.body.reduction_type.startswith("arg") for k in kernel_graph.kernels for n in k.nodes
               if isinstance(n.body, Reduction)) == 2
    values, indices = compile(kernel_graph, TritonOptions(cache_dir=tmp_path))(x)
    want = op(x, 0)
    torch.testing.assert_close(values, want.values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(indices, want.indices)


def _load_lines(fn, args, tmp_path):
    """The `tl.load` lines of the kernels generated for `fn` (the backend's lowering for GPUs)."""
    compile(lower(make_fx(fn)(*args), row_temporaries=True), TritonOptions(cache_dir=tmp_path))
    return [line.strip() for path in sorted(tmp_path.rglob("*.py")) for line in path.read_text().splitlines()
            if "tl.load(" in line]


def _softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def _norm(x, w):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5) * w


def test_rows_read_once_are_evict_first(tmp_path):
    """A reduction kernel's only read of a row (a sum over rows or columns, a persistent
    logsumexp's one pass) is `evict_first`: it streams through L2 once. Rows that later loops
    read again (softmax, norms), values every row reads (a weight) and pointwise kernels carry
    no hint."""
    x, w = torch.randn(6, 40), torch.randn(40)
    sums = _load_lines(lambda x: (x.sum(-1), x.sum(0)), (x,), tmp_path / "sums")
    assert sums and all(line.endswith(", eviction_policy='evict_first')") for line in sums)
    (persistent,) = _load_lines(_logsumexp, (x,), tmp_path / "persistent")
    assert persistent.endswith(", eviction_policy='evict_first')")
    for name, fn, args in [("softmax", _softmax, (x,)), ("norm", _norm, (x, w)), ("pointwise", lambda x: x * 2 + 1, (x,))]:
        lines = _load_lines(fn, args, tmp_path / name)
        assert lines and not any("eviction" in line for line in lines), name


def _layer_norm_weight_grads(g, x, mean, rstd):
    return (g * (x - mean) * rstd).sum((0, 1)), g.sum((0, 1))


def test_independent_reductions_share_one_loop(tmp_path, monkeypatch):
    """A layer norm backward's weight and bias gradients, split over rows: the partials' kernel
    reduces `g * xhat` and `g` in one loop that loads g once, so that load (and x's) streams
    (`evict_first`); the per-row statistics, which every column block's programs read, carry
    no hint. Values as eager's (loopir's split threshold lowered)."""
    monkeypatch.setattr(lower_split, "MIN_ELEMENTS", 1)
    g, x = torch.randn(8, 512, 24), torch.randn(8, 512, 24)
    mean, rstd = torch.randn(8, 512, 1), torch.rand(8, 512, 1) + 0.5
    args = (g, x, mean, rstd)
    kernel_graph = lower(make_fx(_layer_norm_weight_grads)(*args), split_reductions=True)
    assert len(kernel_graph.kernels) == 2, str(kernel_graph)
    partials = kernel_graph.kernels[0]
    assert [n.name for n in partials.nodes] == [n.name for n in next(iter(shared_reduction_loops(partials).values()))]
    module = compile(kernel_graph, TritonOptions(cache_dir=tmp_path))
    source = module.meta["kiln_triton"].source
    kernel0 = source[source.index("def kernel0"):source.index("def kernel1")]
    assert kernel0.count("for roffset in range(") == 1
    loads = {line.split("tl.load(")[1].split(" ")[0]: line for line in kernel0.splitlines() if "tl.load(" in line}
    assert set(loads) == {"in_g_1", "in_x_1", "in_mean_1", "in_rstd_1"}
    assert all(loads[name].endswith("eviction_policy='evict_first')") for name in ("in_g_1", "in_x_1"))
    assert not any("eviction" in loads[name] for name in ("in_mean_1", "in_rstd_1"))
    for got, want in zip(module(*args), _layer_norm_weight_grads(*args)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_a_reduction_of_an_earlier_result_keeps_its_own_loop(options):
    """Joined loops stop at dependences: `b` reads `a`'s mean (a later loop), `c` is
    independent of both (it joins `a`'s loop), `d` reads `c` through a pointwise node."""
    def fn(x, y):
        a = x.mean(-1, keepdim=True)
        b = ((x - a) ** 2).sum(-1)
        c = (y * 2).amax(-1, keepdim=True)
        d = (y - c).exp().sum(-1)
        return b, d, c.squeeze(-1) + a.squeeze(-1)

    module, kernel_graph = check(fn, (torch.randn(5, 37), torch.randn(5, 37)), options)
    (kernel,) = kernel_graph.kernels
    groups = [len(nodes) for nodes in shared_reduction_loops(kernel).values()]
    assert sorted(groups) == [1, 1, 2], groups
    assert module.meta["kiln_triton"].source.count("for roffset in range(") == 3


def _logsumexp(x):
    m = x.amax(-1, keepdim=True)
    return ((x - m).exp().sum(-1, keepdim=True).log() + m).squeeze(-1)


PERSISTENT_CASES = {  # name: (fn, inputs for rows of n, persistent when the row fits)
    "var_mean": (var_mean, lambda n: (torch.randn(6, n) * 3 + 10,), True),
    "bf16_var_mean": (var_mean, lambda n: (torch.randn(6, n).bfloat16(),), True),
    "logsumexp": (_logsumexp, lambda n: (torch.randn(6, n),), True),
    # rows stored (softmax, norms): the looped form, re-reading rows from L1, measured faster
    "softmax": (_softmax, lambda n: (torch.randn(6, n),), False),
    "norm": (_norm, lambda n: (torch.randn(6, n), torch.randn(n)), False),
}


@pytest.mark.parametrize("name", sorted(PERSISTENT_CASES))
def test_kernels_holding_rows_that_fit_one_block_run_without_a_loop(name, tmp_path):
    """A reduction kernel that holds whole rows (several passes over each row, nothing
    row-shaped stored) whose loops all span one static row that fits its RBLOCK cap is
    persistent (Inductor's persistent reduction): straight-line code over that one block,
    asserting at compile time that the launch gives it the whole row, loading each element
    once (later passes reuse the values). Longer rows, rows of symbolic length and kernels
    that store rows loop. Eager's values either way."""
    fn, make, holds = PERSISTENT_CASES[name]
    for cap, fits in ((1024, True), (256, False)):
        options = TritonOptions(cache_dir=tmp_path, contiguous_rblock=cap, float32_contiguous_rblock=cap)
        args = make(700)
        module = compile(lower(make_fx(fn)(*args), row_temporaries=True), options)  # the backend's lowering for GPUs
        kernels = [n.target for n in module.graph.nodes if type(n.target).__name__ == "TritonKernel"]
        source = module.meta["kiln_triton"].source
        persistent = holds and fits
        assert len(kernels) == 1 and kernels[0].persistent == persistent, (name, cap)
        assert ("for roffset in range(" in source) != persistent
        assert source.count("tl.static_assert(RBLOCK >= 700") == persistent
        if persistent:
            loads = [line.split("tl.load(")[1].split(",")[0] for line in source.splitlines() if "tl.load(" in line]
            assert len(loads) == len(set(loads)), loads  # each element loaded once
        torch.testing.assert_close(module(*args), fn(*args), rtol=2e-2 if "bf16" in name else 1e-5, atol=1e-4)
    dynamic = compile(lower(make_fx(fn, tracing_mode="symbolic")(*make(700)), row_temporaries=True), options)
    assert not any(getattr(n.target, "persistent", True) for n in dynamic.graph.nodes
                   if type(n.target).__name__ == "TritonKernel")


@pytest.mark.parametrize("tracing_mode", ["real", "symbolic"])
def test_column_sums_equal_up_to_size1_dims_in_one_kernel(options, tracing_mode):
    """A layer norm's weight and bias gradients (`[C]`, over `[2, 16]`) and a linear's bias
    gradient (`[1, C]`, over the 32 flattened rows) in one kernel (loopir's scheduler), each
    reduction with its own loop over its own ranges."""
    def f(g, x, h):
        return (g * x).sum((0, 1)), g.sum((0, 1)), h.reshape(-1, h.shape[-1]).sum(0, keepdim=True)

    module, kernel_graph = check(f, tuple(torch.randn(2, 16, 37) for _ in range(3)), options, tracing_mode,
                                 rtol=1e-5, atol=1e-5)
    assert len(kernel_graph.kernels) == 1
