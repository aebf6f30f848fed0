"""Small `@triton.jit` device functions that generated kernels call as `kiln_device.<name>`.

They exist where `triton.language` has no long-stable op with torch's semantics: NaN-propagating
maximum/minimum (torch.maximum, amax), tanh, and pow with a tensor exponent. Generated sources
import this module, so it is only imported once a kernel is compiled (never by `generate`).
"""

from __future__ import annotations

import logging

import triton
import triton.language as tl

log = logging.getLogger(__name__)


@triton.jit
def maximum(a, b):
    """torch.maximum: NaN if either operand is NaN (tl.maximum may drop NaNs)."""
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def minimum(a, b):
    """torch.minimum: NaN if either operand is NaN."""
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def tanh(x):
    """tanh from exp, with an odd Taylor series near 0 where 1 - exp(-2|x|) cancels."""
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    large = (1.0 - e) / (1.0 + e)
    large = tl.where(x < 0, -large, large)
    x2 = x * x
    # Series through x**13: truncation error below 4e-16 relative for |x| < 0.125.
    series = 21844.0 / 6081075.0
    series = -1382.0 / 155925.0 + x2 * series
    series = 62.0 / 2835.0 + x2 * series
    series = -17.0 / 315.0 + x2 * series
    series = 2.0 / 15.0 + x2 * series
    series = -1.0 / 3.0 + x2 * series
    series = x + x * x2 * series
    return tl.where(ax < 0.125, series, large)


@triton.jit
def pow(x, y):  # noqa: A001 (the loopir op's name)
    """Floating-point pow with a tensor exponent, following C pow's special cases for
    negative bases (odd/even integer exponents, NaN otherwise), zero exponents and base 1."""
    tl.static_assert(x.dtype.is_floating(), "kiln: pow with an integer tensor exponent is not supported")
    magnitude = tl.exp(y * tl.log(tl.abs(x)))
    y_is_integer = (y % 1.0) == 0
    y_is_odd = tl.abs(y % 2.0) == 1
    negative = tl.where(y_is_odd, -magnitude, magnitude)
    result = tl.where(x < 0, tl.where(y_is_integer, negative, float("nan")), magnitude)
    return tl.where((y == 0) | (x == 1), 1.0, result)


@triton.jit
def expm1(x):
    """exp(x) - 1 without cancellation near 0: 2 t / (1 - t) with t = tanh(x / 2)."""
    t = tanh(0.5 * x)
    small = 2.0 * t / (1.0 - t)
    return tl.where(tl.abs(x) < 0.5, small, tl.exp(x) - 1.0)


@triton.jit
def log1p(x):
    """log(1 + x) without cancellation near 0 (Goldberg's correction: log(u) * x / (u - 1))."""
    u = 1.0 + x
    corrected = tl.log(u) * (x / (u - 1.0))
    return tl.where(u == 1.0, x, tl.where(tl.abs(x) < 0.5, corrected, tl.log(u)))
