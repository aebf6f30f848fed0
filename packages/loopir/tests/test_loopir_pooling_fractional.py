"""Fractional max pooling (2d, 3d) on loopir's reference evaluator, against eager: values and
exact indices, with and without a batch dim, float32 and float64, NaNs and ties; the windows
start where eager's CPU kernel puts them from the op's random samples."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import LoweringError, lower, verify

aten = torch.ops.aten


def _samples(x, n, seed=1):
    batch = x.shape[0] if x.dim() == n + 2 else 1
    return torch.rand(batch, x.shape[-n - 1], n, dtype=x.dtype, generator=torch.Generator().manual_seed(seed))


CASES = [
    # pooled dims, input shape, kernel, output size
    (2, (2, 3, 9, 8), [2, 3], [4, 5]),
    (2, (3, 9, 8), [2, 2], [7, 1]),  # no batch dim; one output point: the last window
    (2, (1, 2, 10, 10), [3, 3], [8, 8]),  # the most outputs the sizes allow
    (2, (1, 1, 5, 6), [5, 6], [1, 1]),  # one window, the whole plane
    (3, (2, 2, 7, 8, 9), [2, 3, 2], [4, 5, 6]),
    (3, (2, 7, 8, 9), [2, 2, 3], [5, 3, 4]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("n", "shape", "kernel", "out"), CASES)
def test_fractional_max_pool_matches_eager(n, shape, kernel, out, dtype):
    op = aten.fractional_max_pool2d.default if n == 2 else aten.fractional_max_pool3d.default
    x = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(0)).round()  # ties
    x.view(-1)[::7] = float("nan")
    samples = _samples(x, n)

    def fn(x, samples):
        return op(x, kernel, out, samples)

    kg = lower(make_fx(fn)(x, samples))
    verify(kg)
    assert kg.kernels and not kg.externs
    (values, indices), (want_values, want_indices) = kg(x, samples), fn(x, samples)
    torch.testing.assert_close(values, want_values, equal_nan=True)
    assert torch.equal(indices, want_indices)


def test_samples_at_their_bounds():
    """Samples of 0 and of just under 1 (torch.rand's range) move every window start."""
    x = torch.randn(1, 2, 11, 9)
    for value in (0.0, 1 - 2**-24, 0.5):
        samples = torch.full((1, 2, 2), value)
        fn = lambda x, s: aten.fractional_max_pool2d(x, [3, 2], [5, 6], s)  # noqa: E731
        got, want = lower(make_fx(fn)(x, samples))(x, samples), fn(x, samples)
        torch.testing.assert_close(got, want)


def test_low_precision_is_refused_by_name():
    x = torch.randn(1, 2, 6, 6, dtype=torch.bfloat16)
    fn = lambda x, s: aten.fractional_max_pool2d(x, [2, 2], [3, 3], s)  # noqa: E731
    with pytest.raises(LoweringError, match="fractional max pooling of torch.bfloat16"):
        lower(make_fx(fn)(x, _samples(x, 2)))
