"""Scatters compile to kiln `Scatter` kernels on every codegen (issue 20): scatter (src and
value), scatter_add, scatter_reduce (sum, prod, mean, amax, amin; include_self or not),
index_reduce, index_put and put (accumulate or not), masked_scatter, and what decomposes into
them (index_add, index_copy, index_fill); embedding_bag and repeat_interleave with a repeats
tensor (lower_segments.py); with duplicate and negative indices, NaN, integers, bool, bfloat16, empty and
non-contiguous inputs, IndexError for an index out of range, deterministic algorithms, and the
backward graphs that scatter (gather, indexing, embedding)."""

from __future__ import annotations

import logging

import pytest
import torch

from kiln.integration import backend, explain

PIPELINE_LOG = "kiln.integration._internal.pipeline"
CODEGENS = ("reference", "cpu", "cuda")  # "cuda" is the Triton codegen; under TRITON_INTERPRET=1 on the CPU


def _compiled(fn, codegen, **options):
    options = {"fallback": False, "codegen": codegen, **options}
    return torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options=options))


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _x(shape, dtype=torch.float32, seed=0):  # drawn on the CPU, then to the default device (conftest.py)
    return torch.randn(shape, generator=_gen(seed), device="cpu").to(torch.get_default_device(), dtype)


def _index(high, shape, seed=1):
    return torch.randint(0, high, shape, generator=_gen(seed), device="cpu").to(torch.get_default_device())


X = _x((6, 5))
SRC = _x((8, 5), seed=2)
DUPLICATES = _index(6, (8, 5))  # 8 rows into 6: duplicates certain
NAN_X = torch.where(X > 1.2, float("nan"), X)
INTS = (X * 4).long()
INT_SRC = (SRC * 4).long()

CASES = {
    # name: (fn, inputs)
    "scatter_src": (lambda x, i, s: x.scatter(1, i[:3, :3] % 5, s[:3, :3]), (X, DUPLICATES.T.contiguous()[:, :5], SRC)),
    "scatter_src_unique": (lambda x, i, s: x.scatter(0, i, s), (X, torch.stack([torch.randperm(6, generator=_gen(k), device="cpu")
                                                                               for k in range(5)], 1).to(X.device), SRC)),
    "scatter_value": (lambda x, i: x.scatter(0, i, -2.5), (X, DUPLICATES)),
    "scatter_add": (lambda x, i, s: x.scatter_add(0, i, s), (X, DUPLICATES, SRC)),
    "scatter_add_int": (lambda x, i, s: x.scatter_add(0, i, s), (INTS, DUPLICATES, INT_SRC)),
    "scatter_add_transposed": (lambda x, i, s: x.t().scatter_add(1, i.t(), s.t() * 2), (X, DUPLICATES, SRC)),
    "scatter_add_empty_index": (lambda x, i, s: x.scatter_add(0, i[:0], s), (X, DUPLICATES, SRC)),
    "scatter_add_3d_dim1": (lambda x, i, s: x.scatter_add(1, i, s), (_x((3, 4, 5)), _index(4, (3, 6, 5)),
                                                                     _x((3, 6, 5), seed=3))),
    "scatter_reduce_legacy_multiply": (lambda x, i, s: x.scatter(0, i, s, reduce="multiply"), (X, DUPLICATES, SRC)),
    "scatter_value_reduce_add": (lambda x, i: x.scatter(0, i, 1.5, reduce="add"), (X, DUPLICATES)),
    "index_put": (lambda x, i, v: torch.index_put(x, (i,), v), (X, torch.tensor([4, 0, -1]), _x((3, 5)))),
    "index_put_accumulate_duplicates": (lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
                                        (X, torch.tensor([1, 1, -5, 3, 1]), _x((5, 5)))),
    "index_put_two_indices_broadcast": (lambda x, i, j, v: torch.index_put(x, (i, j), v, accumulate=True),
                                        (X, torch.tensor([[0], [2], [2]]), torch.tensor([1, -1, 4, 4]), _x((3, 4)))),
    "index_put_second_dim": (lambda x, i, v: torch.ops.aten.index_put(x, [None, i], v, True),
                             (X, torch.tensor([1, 1, 3]), _x((6, 3)))),
    "index_put_bool_accumulate": (lambda x, i, v: torch.index_put(x > 0, (i,), v > 0, accumulate=True),
                                  (X, torch.tensor([1, 1, 2]), _x((3, 5)))),
    "index_put_bfloat16": (lambda x, i, v: torch.index_put(x.bfloat16(), (i,), v.bfloat16(), accumulate=True),
                           (X, torch.tensor([1, 1, 2]), _x((3, 5)))),
    "index_add": (lambda x, i, s: x.index_add(0, i, s, alpha=2), (X, torch.tensor([5, 0, 0, 2, 5, 5, 1, 0]), SRC)),
    "index_copy": (lambda x, s: x.index_copy(0, torch.tensor([3, 0, 5], device=x.device), s[:3]), (X, SRC)),
    "index_fill": (lambda x, i: x.index_fill(1, i, -1.0), (X, torch.tensor([0, 3, 3]))),
    "put_accumulate": (lambda x, i, s: x.put(i, s, accumulate=True), (X, torch.tensor([-1, 0, 0, 29, 7]),
                                                                      _x((5,)))),
    "put_transposed": (lambda x, i, s: x.t().put(i, s), (X, torch.tensor([[1, 9], [4, 3]]), _x((4,)))),
    "index_reduce_prod": (lambda x, s: x.index_reduce(1, torch.tensor([0, 4, 4, 1], device=x.device), s[:6, :4], "prod"), (X, SRC)),
    "index_reduce_mean_noself_int": (lambda x, s: x.index_reduce(0, torch.tensor([2, 2, 0, 5, 2, 1, 1, 0], device=x.device), s,
                                                                 "mean", include_self=False), (INTS, INT_SRC)),
    "index_reduce_amax": (lambda x, s: x.index_reduce(0, torch.tensor([2, 2, 0, 5, 2, 1, 1, 0], device=x.device), s,
                                                                     "amax"),
                          (NAN_X, SRC)),
    "masked_scatter": (lambda x, s: x.masked_scatter(x > 0, s), (X, SRC)),
    "masked_scatter_broadcast_mask": (lambda x, s: x.masked_scatter(torch.tensor([True, False, True, False, True], device=x.device),
                                                                    s * 2), (X, SRC)),
    "embedding_bag_sum_weights": (lambda w, i, o, p: torch.nn.functional.embedding_bag(
        i, w, o, mode="sum", per_sample_weights=p), (X, torch.tensor([0, 5, 5, 2, 1, 3]), torch.tensor([0, 2, 2, 5]),
                                                     _x((6,), seed=5))),
    "embedding_bag_mean_last_offset": (lambda w, i, o: torch.nn.functional.embedding_bag(
        i, w, o, mode="mean", include_last_offset=True), (X, torch.tensor([0, 5, 2, 2, 1, 3]), torch.tensor([0, 2, 2, 6]))),
    "embedding_bag_mean_padding": (lambda w, i, o: torch.nn.functional.embedding_bag(
        i, w, o, mode="mean", padding_idx=2), (X, torch.tensor([0, 5, 2, 2, 1, 3]), torch.tensor([0, 2, 2, 3]))),
    "embedding_bag_max_2d": (lambda w, i: torch.nn.functional.embedding_bag(i, w, mode="max"),
                             (X, torch.tensor([[0, 5, 5], [2, 1, 3]]))),
    "repeat_interleave_tensor": (lambda x, r: x.repeat_interleave(r, dim=0, output_size=9),
                                 (X, torch.tensor([1, 0, 3, 2, 0, 3]))),
    "setitem_accumulate_fn": (lambda x, i, s: torch.zeros(6, 5).index_put_((i,), s, accumulate=True) + x,
                              (X, torch.tensor([0, 5, 5, 2, 0, 0, 1, 0]), SRC)),
}


def _reduce(mode, include_self):
    return lambda x, i, s: x.scatter_reduce(0, i, s, mode, include_self=include_self)


for _mode in ("sum", "prod", "mean", "amax", "amin"):
    for _self in (True, False):
        _name = f"scatter_reduce_{_mode}_{'self' if _self else 'noself'}"
        CASES[_name] = (_reduce(_mode, _self), (NAN_X, DUPLICATES, SRC))
        CASES[_name + "_int"] = (_reduce(_mode, _self), (INTS, DUPLICATES, INT_SRC))
CASES["scatter_reduce_prod_bfloat16"] = (lambda x, i, s: x.bfloat16().scatter_reduce(0, i, s.bfloat16(), "prod"),
                                         (X, DUPLICATES, SRC))
CASES["scatter_reduce_amax_bool"] = (lambda x, i, s: (x > 0).scatter_reduce(0, i, s > 1, "amax"), (X, DUPLICATES, SRC))
CASES["scatter_reduce_amin_bool_noself"] = (lambda x, i, s: (x > 0).scatter_reduce(0, i, s > -1, "amin",
                                                                                   include_self=False),
                                            (X, DUPLICATES, SRC))


def _close(got, expected):
    low = expected.dtype == torch.bfloat16
    tol = {"rtol": 2e-2, "atol": 5e-2} if low else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(got, expected, equal_nan=True, **tol)


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_scatter_matches_eager(name, codegen):
    fn, inputs = CASES[name]
    if X.is_cuda and "bool" in name and "scatter_reduce" in name:
        pytest.skip("eager CUDA has no Bool scatter_reduce to compare with")
    report = explain(fn, *inputs, options={"fallback": False, "codegen": codegen})
    assert report.kernel_count >= 1 and not report.fallback_nodes, str(report)
    torch._dynamo.reset()
    _close(_compiled(fn, codegen)(*inputs), fn(*inputs))


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("bad", [6, -1])
def test_an_index_out_of_range_raises_index_error(codegen, bad):
    torch._dynamo.reset()
    # sync_checks: on a GPU the failed check is then a Python IndexError, not a device assert
    # that would poison the CUDA context of every later test in the process
    compiled = _compiled(lambda x, i, s: x.scatter_add(0, i, s), codegen, sync_checks=True)
    compiled(X, DUPLICATES, SRC)  # compiles with valid indices
    wrong = DUPLICATES.clone()
    wrong[3, 2] = bad  # scatter's indices may not be negative either
    with pytest.raises(IndexError, match="out of bounds"):
        compiled(X, wrong, SRC)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_index_put_wraps_negative_indices_and_checks_bounds(codegen):
    torch._dynamo.reset()
    fn = lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True)  # noqa: E731
    compiled = _compiled(fn, codegen, sync_checks=True)
    v = _x((3, 5))
    _close(compiled(X, torch.tensor([-6, 5, -1]), v), fn(X, torch.tensor([-6, 5, -1]), v))
    with pytest.raises(IndexError, match="out of bounds"):
        compiled(X, torch.tensor([0, -7, 1]), v)


@pytest.mark.parametrize("codegen", ("cpu", "cuda"))
def test_float_sums_are_eager_bit_for_bit_under_deterministic_algorithms(codegen):
    """CPU scatters always run in source order (eager's CPU order); the Triton kernel walks the
    source serially, in order, when deterministic algorithms are on, instead of atomics: the
    same bits on every run (on a GPU eager's own order differs, so values are only close)."""
    # (no multiply feeding the sum: GCC contracts `a + b * c` into an FMA, which eager does not)
    fn = lambda x, i, s: x.scatter_add(0, i, s) + 0  # noqa: E731
    index, src = _index(3, (64, 5)), _x((64, 5), seed=4) * 1e3
    torch._dynamo.reset()
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        compiled = _compiled(fn, codegen)
        got, again = compiled(X[:3], index, src), compiled(X[:3], index, src)
    finally:
        torch.use_deterministic_algorithms(before)
    assert torch.equal(got, again), "a deterministic scatter_add gave two different results"
    if X.is_cuda:  # eager's deterministic CUDA scatter_add sums sorted runs, not in source order
        _close(got, fn(X[:3], index, src))
    else:
        assert torch.equal(got, fn(X[:3], index, src))


def test_a_scatter_runs_in_a_kernel_of_its_own_after_its_base():
    report = explain(lambda x, i, s: (x.sin().scatter_add(0, i, s.cos()) * 2), X, DUPLICATES, SRC,
                     options={"fallback": False, "codegen": "reference"})
    # sin (the base) | the scatter, with cos inlined | * 2
    assert report.kernel_count == 3, str(report)
    assert any(d.kind == "scan" and not d.fused for d in report.fusions), str(report)


def _gradients(fn, codegen, *inputs):
    leaves = [t.detach().requires_grad_() if t.is_floating_point() else t for t in inputs]
    torch._dynamo.reset()
    got = torch.autograd.grad(_compiled(fn, codegen)(*leaves), [t for t in leaves if t.requires_grad])
    expected = torch.autograd.grad(fn(*leaves), [t for t in leaves if t.requires_grad])
    for g, e in zip(got, expected):
        _close(g, e)


TRAINING = {
    "gather": (lambda x, i: (x.gather(0, i) ** 2).sum(), (X, DUPLICATES)),
    "index": (lambda x, i: (x[i].sin() * 3).sum(), (X, torch.tensor([0, 5, 5, -1, 2]))),
    "embedding": (lambda w, i: torch.nn.functional.embedding(i, w).tanh().sum(), (X, _index(6, (4, 7)))),
    "scatter_add": (lambda x, s, i: (x.scatter_add(0, i, s * 2) ** 2).sum(), (X, SRC, DUPLICATES)),
    "scatter_reduce_amax": (lambda x, s, i: x.scatter_reduce(0, i, s, "amax").exp().sum(), (X, SRC, DUPLICATES)),
}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(TRAINING))
def test_backward_graphs_that_scatter_match_eager(name, codegen, caplog, backward_counts):
    fn, inputs = TRAINING[name]
    with caplog.at_level(logging.INFO, logger=PIPELINE_LOG):
        _gradients(fn, codegen, *inputs)
    backward = backward_counts(caplog.text)
    assert backward and all(kernels >= 1 and fallbacks == 0 for kernels, fallbacks in backward), caplog.text


def test_a_gathers_backward_along_dim_1_runs_over_rows_on_the_cpu_bit_for_bit(tmp_path):
    """The backward of `x.gather(1, i)` is a scatter_add along dim 1 into zeros: on the C++ codegen
    each source row writes a row of its own, so its rows run in parallel, each in order
    (`parallel_scatter_source.row_block`); the gradient is eager's bit for bit."""
    if X.is_cuda:
        pytest.skip("the C++ codegen's CPU kernels: CPU tensors only")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = _x((1024, 400), seed=5).requires_grad_()
        index = _index(400, (1024, 300), seed=6)  # 307200 source elements: parallel under either wait policy
        fn = lambda x, i: (x.gather(1, i) ** 2).sum()  # noqa: E731
        torch._dynamo.reset()
        (got,) = torch.autograd.grad(_compiled(fn, "cpu", debug_dir=str(tmp_path))(x, index), [x])
        (expected,) = torch.autograd.grad(fn(x, index), [x])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got, expected)
    sources = "".join(p.read_text() for p in tmp_path.rglob("*kernels.cpp"))
    assert "each thread scatters whole rows" in sources
