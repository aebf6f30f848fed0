"""torch.special functions and searches through the backend (issue 20): compiled to kiln kernels
with no eager fallback (`fallback=False`) on the reference evaluator, the C++ codegen and the
Triton codegen (Triton's interpreter on CPU tensors), and matching eager; searchsorted and
bucketize checked property-style on random sorted sequences with duplicates."""

from __future__ import annotations

import math
import os

import pytest
import torch

from kiln.integration._internal.backend import _compile
from kiln.integration._internal.options import KilnOptions

# Triton kernels run on CPU tensors through Triton's interpreter; it is read when kernels are
# defined, so setting it here holds even when something imported triton already.
os.environ.setdefault("TRITON_INTERPRET", "1")
# a branch not taken is computed too (a loop body has no control flow): Triton's interpreter
# warns about its NaNs and infinities
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

CODEGENS = ["reference", "cpu", "cuda"]  # "cuda" is codegen_triton
SPECIAL_VALUES = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 1.0, -1.0, -2.0, -2.5, 5.0,
                  8.0, 10.0, 1e20]


def compiled(fn, codegen, reports, dynamic=False):
    """`fn` under torch.compile with kiln on `codegen`, refusing eager fallbacks; each graph's
    report goes to `reports`."""
    options = KilnOptions.create({"codegen": codegen, "fallback": False})
    torch._dynamo.reset()
    return torch.compile(fn, backend=lambda gm, inputs: _compile(gm, inputs, options, reports.append),
                         dynamic=dynamic)


def assert_kernels_ran(reports):
    assert reports and all(r.compiled for r in reports), reports
    assert sum(r.kernels for r in reports) >= 1
    assert not any(r.fallback_nodes for r in reports), [r.fallback_nodes for r in reports]


def _tolerance(dtype):
    return {"rtol": 1e-12, "atol": 1e-14} if dtype == torch.float64 else {}


def _inputs(dtype, low, high, count=301):
    dense = torch.linspace(low, high, count, dtype=torch.float64)
    return torch.cat([dense, torch.tensor(SPECIAL_VALUES, dtype=torch.float64)]).to(dtype)


def bessel_family(x):
    return (torch.special.i0(x), torch.special.i0e(x), torch.special.i1(x), torch.special.i1e(x),
            torch.special.modified_bessel_i0(x), torch.special.modified_bessel_i1(x),
            torch.special.modified_bessel_k0(x), torch.special.modified_bessel_k1(x),
            torch.special.scaled_modified_bessel_k0(x), torch.special.scaled_modified_bessel_k1(x),
            torch.special.bessel_j0(x), torch.special.bessel_j1(x), torch.special.bessel_y0(x),
            torch.special.bessel_y1(x), torch.special.spherical_bessel_j0(x))


def gamma_family(x):
    return (torch.digamma(x), torch.polygamma(1, x), torch.polygamma(2, x.abs() + 0.1),
            torch.polygamma(4, x.abs() + 0.1), torch.special.zeta(x.abs() + 1.0, x.abs() + 0.25),
            torch.special.zeta(3.0, x + 30.0))


def normal_family(x):
    return (torch.special.ndtri(torch.sigmoid(x)), torch.special.erfcx(x), torch.special.log_ndtr(x),
            torch.special.ndtr(x), torch.special.erf(x) * torch.special.erfcx(x.abs()))


def elementary_family(x):
    """Special functions torch decomposes into ops loopir already lowers (xlogy of a number
    reaches it as prims.scalar_tensor)."""
    p = torch.sigmoid(x)
    return (torch.special.sinc(x), torch.special.entr(p), torch.special.xlog1py(x, p), torch.special.xlogy(p, x),
            torch.special.xlogy(2.0, p), torch.logit(p), torch.logit(p, eps=1e-3), torch.special.multigammaln(
                x.abs() + 2.0, 3))


def incomplete_gamma_family(x):
    a = x.abs() * 10.0
    return (torch.special.gammainc(a, x.abs() * 9.0 + 0.5), torch.special.gammaincc(a, 250.0 - x.abs() * 3.0),
            torch.special.gammainc(x.abs() + 1e-3, x.abs() * 2.0))


FAMILIES = {"bessel": (bessel_family, (-60, 60)), "gamma": (gamma_family, (-12, 12)),
            "incomplete_gamma": (incomplete_gamma_family, (-40, 40)),
            "normal": (normal_family, (-30, 30)), "elementary": (elementary_family, (-10, 10))}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_special_functions_compile_to_kernels_and_match_eager(family, codegen, dtype):
    fn, (low, high) = FAMILIES[family]
    x = _inputs(dtype, low, high)
    reports = []
    got = compiled(fn, codegen, reports)(x)
    assert_kernels_ran(reports)
    for k, (value, expected) in enumerate(zip(got, fn(x))):
        torch.testing.assert_close(value, expected, equal_nan=True, msg=lambda m, k=k: f"output {k}: {m}",
                                   **_tolerance(dtype))


@pytest.mark.parametrize("codegen", ["reference", "cuda"])  # the C++ codegen's bfloat16 support is not in yet
def test_bfloat16_special_functions_compute_in_float32(codegen):
    def fn(x):
        return torch.special.i0(x), torch.special.i1e(x), torch.digamma(x), torch.polygamma(2, x.abs() + 0.5)

    x = torch.linspace(-10, 10, 201).to(torch.bfloat16)
    reports = []
    got = compiled(fn, codegen, reports)(x)
    assert_kernels_ran(reports)
    for value, expected in zip(got, fn(x)):
        assert value.dtype == torch.bfloat16
        torch.testing.assert_close(value, expected, equal_nan=True)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_integer_inputs_promote_as_in_eager(codegen):
    def fn(n):
        return torch.special.i0(n), torch.digamma(n), torch.special.bessel_j1(n), torch.special.zeta(n, 2)

    n = torch.arange(-6, 7)
    reports = []
    got = compiled(fn, codegen, reports)(n)
    assert_kernels_ran(reports)
    for value, expected in zip(got, fn(n)):
        assert value.dtype == expected.dtype == torch.float32
        torch.testing.assert_close(value, expected, equal_nan=True)


def polynomials(x):
    special = torch.special
    return (special.chebyshev_polynomial_t(x, 9), special.chebyshev_polynomial_u(x, 12),
            special.chebyshev_polynomial_v(x, 4), special.chebyshev_polynomial_w(x, 10),
            special.shifted_chebyshev_polynomial_t(x, 8), special.shifted_chebyshev_polynomial_u(x, 3),
            special.shifted_chebyshev_polynomial_v(x, 7), special.shifted_chebyshev_polynomial_w(x, 6),
            special.hermite_polynomial_h(x, 6), special.hermite_polynomial_he(x, 11),
            special.laguerre_polynomial_l(x, 5), special.legendre_polynomial_p(x, 13))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("codegen", CODEGENS)
def test_orthogonal_polynomials_of_a_number_degree(codegen, dtype):
    # eager's float32 loops run with fused multiply-adds; loopir's recurrences run in float64,
    # so float32 results are compared with eager's float64 ones (NaN x: eager is undefined)
    x = torch.cat([torch.linspace(-1.5, 1.5, 241, dtype=torch.float64),
                   torch.tensor([-1.0, 1.0, 0.0, 0.5, math.inf, -math.inf], dtype=torch.float64)]).to(dtype)
    reports = []
    got = compiled(polynomials, codegen, reports)(x)
    assert_kernels_ran(reports)
    for k, (value, expected) in enumerate(zip(got, polynomials(x.double()))):
        tolerance = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {}
        torch.testing.assert_close(value, expected.to(dtype), equal_nan=True, msg=lambda m, k=k: f"output {k}: {m}",
                                   **tolerance)


# --------------------------------------------------------------------------- searches


def searches(row, values, shuffled, sorter, rows, row_values, right, out_int32):
    side = "right" if right else "left"
    return (torch.searchsorted(row, values, right=right, out_int32=out_int32),
            torch.bucketize(values, row, right=right, out_int32=out_int32),
            torch.searchsorted(shuffled, values, side=side, sorter=sorter, out_int32=out_int32),
            torch.searchsorted(rows, row_values, right=right),
            torch.bucketize(values * 2 + 1, row, right=right),  # a fused producer of the values
            torch.searchsorted(row, 0.5, right=right))


def _random_case(generator, length, dtype):
    """A sorted row with duplicates, the row shuffled with its sorter, 4 sorted rows, and values
    at the row's elements, between them and beyond both ends."""
    row = torch.randint(-6, 7, (length,), generator=generator).sort().values.to(dtype)
    shuffle = torch.randperm(length, generator=generator)
    rows = torch.randint(-6, 7, (4, length), generator=generator).sort(-1).values.to(dtype)
    values = (torch.randint(-16, 17, (64,), generator=generator) / 2).to(dtype)
    row_values = (torch.randint(-16, 17, (4, 9), generator=generator) / 2).to(dtype)
    return row, values, row[shuffle], shuffle.argsort(), rows, row_values


@pytest.mark.parametrize(("right", "out_int32"), [(False, True), (True, False)])  # each value of each (and
@pytest.mark.parametrize("codegen", CODEGENS)                                     # `side`, from `right`)
def test_searches_match_eager_on_random_sorted_sequences(codegen, right, out_int32):
    generator = torch.Generator().manual_seed(int(right) * 2 + int(out_int32))
    reports = []
    fn = compiled(searches, codegen, reports)
    for dtype in (torch.float32, torch.int64):
        for _trial in range(3):  # same shapes: one compile per dtype, several random draws
            args = _random_case(generator, 13, dtype)
            got, expected = fn(*args, right, out_int32), searches(*args, right, out_int32)
            for value, want in zip(got, expected):
                assert value.dtype == want.dtype and torch.equal(value, want), (value, want)
    assert_kernels_ran(reports)
    assert len(reports) == 2


@pytest.mark.parametrize("codegen", CODEGENS)
def test_search_in_a_row_of_dynamic_length(codegen):
    def fn(row, values):
        return torch.searchsorted(row, values), torch.bucketize(values, row, right=True)

    generator = torch.Generator().manual_seed(5)
    reports = []
    search = compiled(fn, codegen, reports, dynamic=True)
    for length in (3, 17, 200, 1000):
        row = torch.randint(-50, 50, (length,), generator=generator).sort().values.float()
        values = torch.randint(-60, 60, (31,), generator=generator).float()
        for value, expected in zip(search(row, values), fn(row, values)):
            assert torch.equal(value, expected)
    assert_kernels_ran(reports)
    assert len(reports) <= 2  # a static graph at most, then one dynamic graph for every length
