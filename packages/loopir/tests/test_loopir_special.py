"""Special functions and searches lowered to loop bodies (issue 20), run on the reference
evaluator against eager: dense ranges, special values (NaN, +-inf, +-0, poles), float32 and
float64 (bfloat16 where eager has it), integer inputs promoted as eager promotes them; and
searchsorted/bucketize against eager on random sorted rows with duplicates."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, supported_ops, verify
from kiln.loopir._internal.lower_special_search import search_steps

aten = torch.ops.aten
SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-30, -1e-30, 1e-300, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 5.0,
           8.0, -8.0, 10.0, 1e-5, 1e17, 1e20, 1e300]
# float64: eager's own algorithms to ~1e-12 relative; the absolute term covers results near a zero
F64 = {"rtol": 1e-12, "atol": 1e-14}


def _inputs(dtype: torch.dtype, low: float, high: float, count: int = 4001) -> torch.Tensor:
    dense = torch.linspace(low, high, count, dtype=torch.float64)
    return torch.cat([dense, torch.tensor(SPECIAL, dtype=torch.float64)]).to(dtype)


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    return F64 if dtype == torch.float64 else {}


# name -> (function, dense range)
UNARY = {
    "i0": (torch.special.i0, (-120, 120)),
    "i0e": (torch.special.i0e, (-1000, 1000)),
    "i1": (torch.special.i1, (-120, 120)),
    "i1e": (torch.special.i1e, (-1000, 1000)),
    "modified_bessel_i0": (torch.special.modified_bessel_i0, (-120, 120)),
    "modified_bessel_i1": (torch.special.modified_bessel_i1, (-120, 120)),
    "modified_bessel_k0": (torch.special.modified_bessel_k0, (-1, 100)),
    "modified_bessel_k1": (torch.special.modified_bessel_k1, (-1, 100)),
    "scaled_modified_bessel_k0": (torch.special.scaled_modified_bessel_k0, (-1, 1000)),
    "scaled_modified_bessel_k1": (torch.special.scaled_modified_bessel_k1, (-1, 1000)),
    "bessel_j0": (torch.special.bessel_j0, (-200, 200)),
    "bessel_j1": (torch.special.bessel_j1, (-200, 200)),
    "bessel_y0": (torch.special.bessel_y0, (-1, 200)),
    "bessel_y1": (torch.special.bessel_y1, (-1, 200)),
    "spherical_bessel_j0": (torch.special.spherical_bessel_j0, (-100, 100)),
    "digamma": (torch.digamma, (-50, 50)),
    "trigamma": (lambda x: torch.polygamma(1, x), (-50, 50)),
    "ndtri": (torch.special.ndtri, (-0.1, 1.1)),
    "erfcx": (torch.special.erfcx, (-30, 100)),
    "log_ndtr": (torch.special.log_ndtr, (-100, 40)),
}
WITH_LOW_PRECISION = ("i0", "i0e", "i1", "i1e", "digamma", "trigamma")  # eager computes these in float32


def _lowered(fn, *args, tracing_mode="real"):
    kg = lower(make_fx(fn, tracing_mode=tracing_mode)(*args))
    verify(kg)
    assert kg.kernels
    return kg


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_special_function_matches_eager_over_a_dense_range(check, name, dtype):
    fn, (low, high) = UNARY[name]
    check(fn, _inputs(dtype, low, high), **_tolerance(dtype))


@pytest.mark.parametrize("name", WITH_LOW_PRECISION)
def test_bfloat16_computes_in_float32_as_eager(check, name):
    fn, (low, high) = UNARY[name]
    check(fn, _inputs(torch.bfloat16, low, high, 501))


@pytest.mark.parametrize("name", ["i0", "digamma", "bessel_j0", "erfcx", "modified_bessel_k1"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool], ids=str)
def test_integer_inputs_promote_to_the_default_float_dtype(check, name, dtype):
    fn = UNARY[name][0]
    x = torch.arange(-20, 21).to(dtype)
    kg = check(fn, x)
    assert kg(x).dtype == torch.float32


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_polygamma_matches_eager(check, n, dtype):
    positive = torch.cat([torch.linspace(1e-3, 60, 3001, dtype=torch.float64),
                          torch.logspace(-12, 12, 97, dtype=torch.float64)]).to(dtype)
    check(lambda x: torch.polygamma(n, x), positive, **_tolerance(dtype))
    # x < 0: poles at the integers; eager sums about -x terms there (in float32 for float32),
    # loopir splits the sum into sums at positive arguments (in float64), so both round
    # differently where the terms cancel: float32 results are compared with eager's float64 ones
    negative = torch.cat([torch.linspace(-6, 0, 1201, dtype=torch.float64)[:-1] + 1e-3,
                          torch.tensor([-3.0, -1.0, -0.0, 0.0, math.nan, math.inf, -math.inf], dtype=torch.float64)])
    fn = lambda x: torch.polygamma(n, x)  # noqa: E731
    kg = _lowered(fn, negative.to(dtype))
    if dtype == torch.float64:
        torch.testing.assert_close(kg(negative), fn(negative), rtol=1e-9, atol=1e-9, equal_nan=True)
    elif n <= 1:  # digamma and trigamma: eager's float32 algorithms
        torch.testing.assert_close(kg(negative.float()), fn(negative.float()), equal_nan=True)
    else:
        x = negative.float()
        torch.testing.assert_close(kg(x), fn(x.double()).float(), equal_nan=True)
        torch.testing.assert_close(kg(x), fn(x), rtol=1e-5, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("n", [2, 3])
def test_polygamma_of_a_tiny_negative_argument_keeps_its_pole_term(check, n):
    # q = -1e-30: its fractional part 1 - 1e-30 rounds to 1, so the split must not use 1 - f
    x = torch.tensor([-1e-30, -1e-17, -1e-300, 1e-300], dtype=torch.float64)
    check(lambda x: torch.polygamma(n, x), x, **F64)


@pytest.mark.parametrize("n", [2, 3])
def test_polygamma_bfloat16(check, n):
    check(lambda x: torch.polygamma(n, x), torch.linspace(0.05, 30, 301).to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_zeta_over_a_grid_of_both_arguments(check, dtype):
    x = torch.cat([torch.linspace(0.5, 30, 60, dtype=torch.float64), torch.tensor([1.0, 1.0 + 1e-9, 2.0, 3.0, math.nan,
                                                                                  math.inf], dtype=torch.float64)])
    q = torch.cat([torch.logspace(-8, 4, 70, dtype=torch.float64), torch.tensor([0.0, -0.0, -2.0, -2.25, math.nan, math.inf,
                                                                                -math.inf], dtype=torch.float64)])
    xs, qs = torch.meshgrid(x, q, indexing="ij")
    check(torch.special.zeta, xs.contiguous().to(dtype), qs.contiguous().to(dtype), **_tolerance(dtype))


def test_zeta_at_negative_non_integer_q_and_integer_x(check):
    x = torch.tensor([2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float64).view(5, 1)
    q = (-torch.linspace(0.05, 12.95, 130, dtype=torch.float64)).view(1, 130)
    check(torch.special.zeta, x.expand(5, 130).contiguous(), q.expand(5, 130).contiguous(), rtol=1e-10, atol=1e-10)


def test_zeta_at_negative_q_is_exact_where_eagers_direct_sum_cancels():
    # odd x, q = -2.5: the terms at -2.5, -1.5, -0.5 cancel those at 0.5, 1.5, 2.5, leaving
    # zeta(x, 3.5); eager's sum loses it to rounding (x = 27 gives a negative value), the split
    # into zeta(x, 1/2) - zeta(x, 1/2) + zeta(x, 7/2) keeps it
    mpmath = pytest.importorskip("mpmath")
    x = torch.arange(9.0, 31.0, 2.0, dtype=torch.float64)
    q = torch.full_like(x, -2.5)
    expected = torch.tensor([float(mpmath.zeta(float(a), -2.5)) for a in x], dtype=torch.float64)
    kg = _lowered(torch.special.zeta, x, q)
    torch.testing.assert_close(kg(x, q), expected, rtol=1e-12, atol=0)


def test_zeta_scalar_overloads(check):
    q = torch.linspace(0.1, 10, 100, dtype=torch.float64)
    check(lambda q: torch.special.zeta(3.5, q), q, **F64)
    check(lambda x: torch.special.zeta(x, 2.25), q + 1, **F64)
    gm = make_fx(lambda q: torch.special.zeta(3.5, q))(q)
    assert aten.special_zeta.self_scalar in {n.target for n in gm.graph.nodes}


def test_float32_zeta_computes_in_float64():
    # the direct sum in float32 would lose digits to the float32 rounding of q**-x
    x, q = torch.tensor([3.0]), torch.tensor([0.001])
    kg = _lowered(torch.special.zeta, x, q)
    expected = torch.special.zeta(x.double(), q.double()).float()
    assert torch.equal(kg(x, q), expected)


def _incomplete_gamma_grid(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """a from 1e-6 to 3e6 (and 0, inf, NaN, -1, eager's region edges 20 and 200); x a multiple
    of a from 1e-8 to 100, dense around x = a, and 0, inf, NaN, -1, 0.5, 1, 1.1."""
    a = torch.cat([torch.logspace(-6, 6.5, 60, dtype=torch.float64),
                   torch.tensor([0.0, 0.5, 1.0, 20.0, 20.5, 200.0, 200.5, math.inf, math.nan, -1.0], dtype=torch.float64)])
    ratio = torch.cat([torch.logspace(-8, 2, 60, dtype=torch.float64), torch.linspace(0.5, 1.5, 51, dtype=torch.float64)])
    extra = torch.tensor([0.0, math.inf, math.nan, -1.0, 0.5, 1.0, 1.1, 1e-300], dtype=torch.float64)
    a_all = torch.cat([a.repeat_interleave(ratio.numel()), a.repeat_interleave(extra.numel())])
    x_all = torch.cat([(a.view(-1, 1) * ratio).reshape(-1), extra.repeat(a.numel())])
    return a_all.to(dtype), x_all.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("fn", [torch.special.gammainc, torch.special.gammaincc], ids=["igamma", "igammac"])
def test_incomplete_gamma_matches_eager_over_every_region(check, fn, dtype):
    check(fn, *_incomplete_gamma_grid(dtype), **_tolerance(dtype))


def test_incomplete_gamma_bfloat16(check):
    a, x = torch.linspace(0.1, 50, 200).to(torch.bfloat16), torch.linspace(50, 0.1, 200).to(torch.bfloat16)
    check(torch.special.gammainc, a, x)
    check(torch.special.gammaincc, a, x)


def test_incomplete_gamma_at_large_a_takes_the_expansion_where_eager_sums_slowly():
    # a > 200, 4.5 / sqrt(a) < |x - a| / a < 0.3: eager sums a series of about sqrt(a) terms (up to
    # its cap of 2000 steps, 6e-8 off here); the unrolled body takes Temme's expansion instead
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 40
    a = torch.tensor([562424.9452232864, 1000.0, 1e4, 250.0], dtype=torch.float64)
    x = torch.tensor([558891.0602354865, 800.0, 7100.0, 300.0], dtype=torch.float64)
    kg = _lowered(torch.special.gammainc, a, x)
    expected = torch.tensor([float(mpmath.gammainc(p, 0, q, regularized=True)) for p, q in zip(a.tolist(), x.tolist())],
                            dtype=torch.float64)
    torch.testing.assert_close(kg(a, x), expected, rtol=1e-11, atol=0)


def test_log_ndtr_through_erfcx_matches_eager_in_both_branches(check):
    x = torch.tensor([-1e3, -40.0, -1.5, -1.0, -0.999, 0.0, 3.0, 30.0], dtype=torch.float64)
    check(torch.special.log_ndtr, x, **F64)


def test_every_special_lowering_is_registered():
    expected = {aten.i0.default, aten.special_i0e.default, aten.special_i1.default, aten.special_i1e.default,
                aten.special_ndtri.default, aten.special_log_ndtr.default, aten.special_erfcx.default,
                aten.digamma.default, aten.polygamma.default, aten.special_zeta.default,
                aten.special_zeta.self_scalar, aten.special_zeta.other_scalar, aten.special_bessel_j0.default,
                aten.special_bessel_j1.default, aten.special_bessel_y0.default, aten.special_bessel_y1.default,
                aten.special_modified_bessel_i0.default, aten.special_modified_bessel_i1.default,
                aten.special_modified_bessel_k0.default, aten.special_modified_bessel_k1.default,
                aten.special_scaled_modified_bessel_k0.default, aten.special_scaled_modified_bessel_k1.default,
                aten.special_spherical_bessel_j0.default, aten.searchsorted.Tensor, aten.searchsorted.Scalar,
                aten.bucketize.Tensor, aten.bucketize.Scalar, aten.igamma.default, aten.igammac.default}
    assert expected <= supported_ops()


def test_prims_scalar_tensor_of_decomposed_xlogy_is_a_constant(check):
    # torch's xlogy/xlog1py references make their number operand a tensor with prims.scalar_tensor
    p = torch.linspace(0, 1, 11)
    scalar_tensor = torch.ops.prims.scalar_tensor.default
    kg = check(lambda p: scalar_tensor(2.5, dtype=torch.float32, device=p.device) * torch.log(p), p)
    assert len(kg.kernels) == 1


def test_special_functions_fuse_with_their_neighbours():
    x = torch.linspace(0.1, 10, 50)
    kg = _lowered(lambda x: torch.special.i0(x * 2) + torch.digamma(x).exp(), x)
    assert len(kg.kernels) == 1
    torch.testing.assert_close(kg(x), torch.special.i0(x * 2) + torch.digamma(x).exp())


POLYNOMIALS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
               "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
               "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
               "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_orthogonal_polynomial_of_a_number_degree_matches_eager(name, dtype):
    # NaN is left out: eager returns an uninitialized value for it (its recurrence stops before
    # its first step). float32 is compared with eager's float64 result: eager's float32 loop is
    # compiled with fused multiply-adds, loopir runs the recurrence in float64.
    x = torch.cat([torch.linspace(-1.5, 1.5, 301, dtype=torch.float64),
                   torch.tensor([-1.0, 1.0, 0.0, -0.0, 0.5, 0.75, math.inf, -math.inf], dtype=torch.float64)])
    fn = getattr(torch.special, name)
    for n in (-1, 0, 1, 2, 3, 5, 7, 10, 20, 2.7, True):
        gm = make_fx(functools.partial(fn, n=n))(x.to(dtype))
        assert getattr(aten, f"special_{name}").n_scalar in {node.target for node in gm.graph.nodes}
        kg = lower(gm)
        verify(kg)
        got = kg(x.to(dtype))
        if dtype == torch.float64:
            torch.testing.assert_close(got, fn(x, n), rtol=1e-10, atol=1e-12, equal_nan=True, msg=f"n = {n}")
        else:
            torch.testing.assert_close(got, fn(x.float().double(), n).float(), equal_nan=True, msg=f"n = {n}")


def test_orthogonal_polynomial_degree_limits():
    x = torch.linspace(-1, 1, 11)
    kg = _lowered(lambda x: torch.special.hermite_polynomial_h(x, 200), x)  # beyond float32's 128: NaN
    torch.testing.assert_close(kg(x), torch.special.hermite_polynomial_h(x, 200), equal_nan=True)
    with pytest.raises(NotImplementedError, match="unrolled 1000 times"):
        lower(make_fx(lambda x: torch.special.legendre_polynomial_p(x, 1000))(x))
    # a tensor degree: eager runs each element's own number of steps, which nothing bounds
    assert aten.special_legendre_polynomial_p.default not in supported_ops()


# --------------------------------------------------------------------------- searches


def _sorted_row(generator: torch.Generator, length: int, dtype: torch.dtype) -> torch.Tensor:
    """A sorted row with duplicates: values drawn from a small range."""
    return torch.randint(-6, 7, (length,), generator=generator).sort().values.to(dtype)


def _queries(generator: torch.Generator, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Values at the boundaries (integers), between them (halves) and beyond both ends."""
    return (torch.randint(-16, 17, (count,), generator=generator) / 2).to(dtype)


def _check_search(fn, *args, tracing_mode="real"):
    kg = _lowered(fn, *args, tracing_mode=tracing_mode)
    got, expected = kg(*args), fn(*args)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got, expected), (got, expected)
    return kg


@pytest.mark.parametrize("out_int32", [False, True])
@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("length", [1, 2, 3, 7, 8, 9, 64, 100])
def test_searchsorted_and_bucketize_match_eager_on_random_sorted_rows(length, dtype, right, out_int32):
    generator = torch.Generator().manual_seed(length)
    # several rows and query sets, one graph: each row of `rows` searched for its own values
    rows = torch.stack([_sorted_row(generator, length, dtype) for _ in range(3)])
    values = torch.stack([_queries(generator, 40, dtype if dtype.is_floating_point else torch.float32)
                          for _ in range(3)])
    _check_search(lambda s, v: torch.searchsorted(s, v, right=right, out_int32=out_int32), rows, values)
    _check_search(lambda v, s: torch.bucketize(v, s, right=right, out_int32=out_int32), values, rows[0])


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_with_a_sorter(right):
    generator = torch.Generator().manual_seed(1)
    for length in (1, 5, 33):
        row = _sorted_row(generator, length, torch.float32)
        shuffle = torch.randperm(length, generator=generator)
        shuffled, sorter = row[shuffle], shuffle.argsort()
        values = _queries(generator, 50, torch.float32)
        _check_search(lambda s, v, o: torch.searchsorted(s, v, right=right, sorter=o), shuffled, values, sorter)
        _check_search(lambda s, v, o: torch.searchsorted(s, v, side="right" if right else "left", sorter=o),
                      shuffled, values, sorter)


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_in_the_rows_of_a_batched_sequence(right):
    generator = torch.Generator().manual_seed(2)
    rows = torch.stack([_sorted_row(generator, 11, torch.float64) for _ in range(6)]).view(2, 3, 11)
    values = _queries(generator, 2 * 3 * 9, torch.float64).view(2, 3, 9)
    _check_search(lambda s, v: torch.searchsorted(s, v, right=right), rows, values)
    shuffle = torch.stack([torch.randperm(11, generator=generator) for _ in range(6)]).view(2, 3, 11)
    shuffled, sorter = rows.gather(-1, shuffle), shuffle.argsort(-1)
    _check_search(lambda s, v, o: torch.searchsorted(s, v, sorter=o), shuffled, values, sorter)


@pytest.mark.parametrize("right", [False, True])
def test_scalar_overloads_and_their_type_promotion(right):
    row = torch.tensor([0.1, 0.5, 0.5, 2.0], dtype=torch.float32)
    # 0.1 compares as a float32 (eager's result_type rule), so it equals row[0]
    _check_search(lambda s: torch.searchsorted(s, 0.1, right=right), row)
    _check_search(lambda s: torch.bucketize(0.5, s, right=right), row)
    _check_search(lambda s: torch.searchsorted(s, 2, right=right), torch.tensor([1, 2, 2, 3]))
    _check_search(lambda s: torch.searchsorted(s, 2.5, right=right), torch.tensor([1, 2, 2, 3]))
    gm = make_fx(lambda s: torch.bucketize(0.5, s))(row)
    assert aten.bucketize.Scalar in {n.target for n in gm.graph.nodes}


def test_mixed_dtypes_compare_in_the_promoted_dtype():
    row = torch.tensor([0.1, 0.5, 2.0], dtype=torch.float32)
    values = torch.tensor([0.1, 0.5, 1.0], dtype=torch.float64)  # 0.1 (float64) < 0.1 (float32)
    _check_search(lambda s, v: torch.searchsorted(s, v), row, values)
    _check_search(lambda s, v: torch.searchsorted(s, v, right=True), torch.tensor([1, 2, 3]), torch.tensor([1.5, 2.0]))


@pytest.mark.parametrize("right", [False, True])
def test_nans_and_unsorted_rows_give_eagers_results(right):
    row, values = torch.tensor([1.0, 2.0, math.nan]), torch.tensor([1.5, math.nan, 5.0, 2.0, -math.inf])
    _check_search(lambda s, v: torch.searchsorted(s, v, right=right), row, values)
    generator = torch.Generator().manual_seed(3)
    unsorted = torch.randn(37, generator=generator)
    _check_search(lambda s, v: torch.searchsorted(s, v), unsorted, torch.randn(100, generator=generator))


def test_empty_boundaries_give_zeros():
    _check_search(lambda v, s: torch.bucketize(v, s), torch.randn(5), torch.empty(0))


def test_each_step_of_the_search_is_one_load_of_the_row(reads_of):
    for length in (1, 2, 7, 8, 100):
        kg = _check_search(lambda row, values: torch.searchsorted(row, values), torch.arange(float(length)),
                           torch.randn(20))
        assert len(reads_of(kg)["row_1"]) == search_steps(length) == math.ceil(math.log2(length + 1))


def test_a_row_of_symbolic_length_unrolls_the_longest_search_and_runs_at_any_length(reads_of):
    fn = lambda row, values: torch.searchsorted(row, values, right=True)  # noqa: E731
    kg = _check_search(fn, torch.arange(37.0), torch.randn(9), tracing_mode="symbolic")
    assert len(reads_of(kg)["row_1"]) == 63
    generator = torch.Generator().manual_seed(4)
    for length in (2, 5, 1000):
        row, values = _sorted_row(generator, length, torch.float32), _queries(generator, 33, torch.float32)
        assert torch.equal(kg(row, values), fn(row, values))


def test_a_negative_sorter_entry_raises_as_in_eager():
    row, values = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.5])
    sorter = torch.tensor([0, 1, -1])
    with pytest.raises(RuntimeError, match="sorter index out of range"):
        torch.searchsorted(row, values, sorter=sorter)
    kg = _lowered(lambda s, v, o: torch.searchsorted(s, v, sorter=o), row, values, torch.tensor([0, 1, 2]))
    with pytest.raises(IndexError, match="out of bounds"):
        kg(row, values, sorter)
