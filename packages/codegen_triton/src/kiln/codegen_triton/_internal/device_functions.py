"""Small `@triton.jit` device functions that generated kernels call as `kiln_device.<name>`,
and the `libdevice` they call as `libdevice.<name>`.

Device functions exist where `triton.language` has no long-stable op with torch's semantics:
NaN-propagating maximum/minimum (torch.maximum, amax), pow with a tensor exponent, Python's
floor division and remainder, torch's shifts. Generated sources import this module, so it is
only imported once a kernel is compiled (never by `generate`).

`libdevice` is `triton.language.extra.libdevice` (the CUDA/HIP math library) when kernels are
compiled. Triton's interpreter cannot run library calls, so under it `libdevice` is a stand-in
with the same names computing with torch on the interpreter's NumPy blocks: interpreter tests
check everything around those calls (which function, dtypes, masks, broadcasting); a GPU run
(`KILN_TRITON_TEST_DEVICE=cuda`) checks the library itself.
"""

from __future__ import annotations

import logging
import types

import triton
import triton.language as tl

log = logging.getLogger(__name__)

# libdevice functions generated kernels use, and the torch function that stands in for each
# under the interpreter.
LIBDEVICE_FUNCTIONS = {
    "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
    "sinh": "sinh", "cosh": "cosh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
    "erfc": "erfc", "erfinv": "erfinv", "lgamma": "lgamma", "exp2": "exp2", "log2": "log2",
    "log10": "log10", "trunc": "trunc", "rint": "round", "atan2": "atan2", "hypot": "hypot",
    "copysign": "copysign", "nextafter": "nextafter", "tanh": "tanh", "expm1": "expm1", "log1p": "log1p",
}


def _interpreter_libdevice() -> types.SimpleNamespace:
    """`libdevice` for Triton's interpreter: each function applies torch to the blocks' data."""
    import numpy as np
    import torch
    from triton.runtime.interpreter import TensorHandle

    def stand_in(torch_name: str):
        torch_fn = getattr(torch, torch_name)

        def apply(*args):
            dtype = args[0].dtype
            values = [torch.from_numpy(np.ascontiguousarray(a.handle.data)) for a in args]
            data = torch_fn(*values).numpy().astype(args[0].handle.data.dtype)
            block = tl.block_type(dtype, list(data.shape)) if data.ndim else dtype
            return tl.tensor(TensorHandle(data, dtype), block)

        apply.__name__ = torch_name
        return apply

    return types.SimpleNamespace(**{name: stand_in(t) for name, t in LIBDEVICE_FUNCTIONS.items()})


@triton.jit
def either(a, b):
    """a | b of two booleans. Device functions use it instead of `|` (and `both` instead of
    `&`): Triton's interpreter cannot `|` a block with a 0-d block (a 0-d tensor operand,
    loaded as a scalar): TypeError from NumPy's bitwise_or. Compiled, it is the same `or`."""
    return tl.where(a, a, b)


@triton.jit
def both(a, b):
    """a & b of two booleans (see `either`)."""
    return tl.where(a, b, a)


@triton.jit
def maximum(a, b):
    """torch.maximum: NaN if either operand is NaN. Floating operands take one NaN-propagating
    max instruction (`max.NaN` on sm_80+) rather than a compare, a NaN test and a select:
    reductions over rows combine with it in every step, and softmax's max pass was bound by
    those three instructions (H200, bf16 rows of 16384 elements, CUDA graph replays: 76.5 ->
    85.4% of copy; BENCHMARKS.md session 16). The sign of a zero result may differ from
    eager's, which picks whichever operand comes first."""
    if a.dtype.is_floating():
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    else:
        return tl.where(a > b, a, b)


@triton.jit
def minimum(a, b):
    """torch.minimum: NaN if either operand is NaN (see `maximum`)."""
    if a.dtype.is_floating():
        return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
    else:
        return tl.where(a < b, a, b)


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
    return tl.where(either(y == 0, x == 1), 1.0, result)


@triton.jit
def log1p(x):
    """log(1 + x) without cancellation near 0 (Goldberg's correction: log(u) * x / (u - 1)), for
    the logaddexp scan's combine (generated kernels call libdevice.log1p)."""
    u = 1.0 + x
    corrected = tl.log(u) * (x / (u - 1.0))
    return tl.where(u == 1.0, x, tl.where(tl.abs(x) < 0.5, corrected, tl.log(u)))


INTERPRETED = type(maximum).__name__ == "InterpretedFunction"
if INTERPRETED:
    libdevice = _interpreter_libdevice()
else:
    from triton.language.extra import libdevice


@triton.jit
def welford_combine(mean_a, m2_a, count_a, mean_b, m2_b, count_b):
    """The combine function of a Welford reduction's lanes (`welford_source.py`): the (mean, m2,
    count) of two disjoint sets of values, Chan et al.'s pairwise update. A lane that saw no
    value (count 0) changes nothing; an infinity or NaN makes m2 NaN, as eager's variance of
    such a row is."""
    count = count_a + count_b
    share = tl.where(count == 0, 0.0, count_b / count)
    delta = mean_b - mean_a
    # (delta * count_a * share) * delta, not delta * delta * ...: with count_a 0 a delta whose
    # square overflows must add 0, not inf * 0
    return mean_a + delta * share, m2_a + m2_b + (delta * (count_a * share)) * delta, count


@triton.jit
def multiply(a, b):
    """The combine function of prod reductions."""
    return a * b


@triton.jit
def _take_second(value_a, index_a, value_b, index_b, b_better):
    """Which of two (value, position) candidates an arg reduction keeps: NaN first, then the
    better value (`b_better`: b's value is strictly better), then the lower position."""
    nan_a = value_a != value_a
    nan_b = value_b != value_b
    tie = (value_a == value_b) | (nan_a & nan_b)
    take = tl.where(nan_a | nan_b, nan_b & ((nan_a == 0) | (index_b < index_a)), b_better)
    return take | (tie & (index_b < index_a))


@triton.jit
def argmax_combine(value_a, index_a, value_b, index_b):
    """Combine function of argmax folds over (value, position) pairs."""
    take = _take_second(value_a, index_a, value_b, index_b, value_b > value_a)
    return tl.where(take, value_b, value_a), tl.where(take, index_b, index_a)


@triton.jit
def argmin_combine(value_a, index_a, value_b, index_b):
    """Combine function of argmin folds over (value, position) pairs."""
    take = _take_second(value_a, index_a, value_b, index_b, value_b < value_a)
    return tl.where(take, value_b, value_a), tl.where(take, index_b, index_a)


@triton.jit
def fmax(a, b):
    """torch.fmax: the other operand where one is NaN."""
    return tl.where(either(a > b, b != b), a, b)


@triton.jit
def fmin(a, b):
    """torch.fmin: the other operand where one is NaN."""
    return tl.where(either(a < b, b != b), a, b)


@triton.jit
def sign(x):
    """-1, 0 or 1 in x's dtype; 0 for NaN (as torch.sign)."""
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


@triton.jit
def signbit(x):
    """The sign bit of a float (set for -0.0 and negative NaNs)."""
    if x.dtype == tl.float64:
        bits = x.to(tl.int64, bitcast=True)
    else:
        bits = x.to(tl.int32, bitcast=True)
    return bits < 0


# Integer division and remainder by zero do not raise on a GPU (eager CUDA neither): they give 0
# here, whatever the hardware would; division by -1 negates with wraparound. Both divisors are
# replaced by 1 before dividing (no undefined operation reaches the hardware or NumPy).
@triton.jit
def _safe_divisor(b):
    if b.dtype.is_int_unsigned():  # no -1 (an unsigned block refuses a negative scalar)
        return tl.where(b == 0, 1, b)
    else:
        return tl.where(either(b == 0, b == -1), 1, b)


@triton.jit
def fmod(a, b):
    """C's fmod on floats, C's % on integers (Triton's % truncates); integer x % 0 is 0."""
    if a.dtype.is_floating():
        return a % b
    else:
        return a % _safe_divisor(b)


@triton.jit
def remainder(a, b):
    """Python's %: the result has b's sign (Triton's % truncates, as C's fmod and %)."""
    r = fmod(a, b)
    if a.dtype.is_int_unsigned():
        return r
    else:
        return tl.where(both(r != 0, (r < 0) != (b < 0)), r + b, r)


@triton.jit
def truncdiv(a, b):
    """a / b rounded toward zero; exact on integers (Triton's integer // truncates); integer
    x / 0 is 0."""
    if a.dtype.is_floating():
        return libdevice.trunc(a / b)
    else:
        q = a // _safe_divisor(b)
        if not a.dtype.is_int_unsigned():
            q = tl.where(b == -1, 0 - q, q)
        return tl.where(b == 0, 0, q)


@triton.jit
def floordiv(a, b):
    """Python's //. Floats divide the exact a - fmod(a, b), so the quotient is not rounded
    across an integer; b == 0 gives a / b (inf or NaN). Integer x // 0 is 0."""
    if a.dtype.is_floating():
        mod = a % b
        div = (a - mod) / b
        div = tl.where(both(mod != 0, (b < 0) != (mod < 0)), div - 1.0, div)
        floored = tl.floor(div)
        floored = tl.where(div - floored > 0.5, floored + 1.0, floored)
        quotient = a / b
        floored = tl.where(div == 0, quotient * 0.0, floored)  # a zero with the quotient's sign
        return tl.where(b == 0, quotient, floored)
    else:
        q = truncdiv(a, b)
        if a.dtype.is_int_unsigned():
            return q
        else:
            return tl.where(both(fmod(a, b) != 0, (a < 0) != (b < 0)), q - 1, q)


@triton.jit
def gcd(a, b):
    """Euclid's algorithm on |a|, |b|, every lane until the block's last one finishes."""
    a, b = tl.broadcast(tl.abs(a), tl.abs(b))
    while tl.max(b) != 0:
        nonzero = b != 0
        rest = a % tl.where(nonzero, b, 1)
        a = tl.where(nonzero, b, a)
        b = tl.where(nonzero, rest, 0)
    return a


@triton.jit
def left_shift(a, b):
    """a << b; 0 when b is negative or at least a's width (as torch)."""
    bits: tl.constexpr = a.dtype.primitive_bitwidth
    out_of_range = either(b < 0, b >= bits)
    return tl.where(out_of_range, 0, a << tl.where(out_of_range, 0, b))


@triton.jit
def right_shift(a, b):
    """Arithmetic a >> b; the sign fill when b is negative or at least a's width (as torch;
    unsigned: logical, 0)."""
    bits: tl.constexpr = a.dtype.primitive_bitwidth
    if a.dtype.is_int_unsigned():  # a logical shift: 0 past the width
        out_of_range = either(b < 0, b >= bits)
        return tl.where(out_of_range, 0, a >> tl.where(out_of_range, 0, b))
    else:
        return a >> tl.where(either(b < 0, b >= bits), bits - 1, b)


# Random numbers: loopir's generator (kiln/loopir/_internal/philox.py) is Philox4x32-10 keyed by
# the 64-bit seed with the 64-bit offset as the counter, which is Triton's `tl.randint4x`; `rand`
# and `randn` are Triton's own functions of it.
@triton.jit
def rand(seed, offset):
    """Uniform float32 in [0, 1) for each offset."""
    return tl.rand(seed, offset)


@triton.jit
def randn(seed, offset):
    """Standard normal float32 for each offset (Box-Muller on the first two words)."""
    return tl.randn(seed, offset)


@triton.jit
def randint64(seed, offset, low, high):
    """int64 uniform in [low, high): 63 random bits (words 1 and 0) modulo high - low."""
    c0, c1, _, _ = tl.randint4x(seed, offset)
    bits = ((c1 & 0x7FFFFFFF).to(tl.int64) << 32) | c0.to(tl.int64)
    return low + bits % (high - low)


@triton.jit
def logaddexp(a, b):
    """log(exp(a) + exp(b)) without overflow, as eager's logcumsumexp combines: equal infinities
    give themselves (inf - inf would be NaN), NaN propagates."""
    hi = tl.maximum(a, b)
    lo = tl.minimum(a, b)
    combined = hi + log1p(tl.exp(lo - hi))
    same_infinity = both(lo == hi, tl.abs(lo) == float("inf"))
    return tl.where(either(a != a, b != b), a + b, tl.where(same_infinity, a, combined))


@triton.jit
def argmax_scan_combine(v1, i1, v2, i2):
    """cummax's running (value, position): the right one where it is as large or NaN."""
    right = (v2 >= v1) | (v2 != v2)
    return tl.where(right, v2, v1), tl.where(right, i2, i1)


@triton.jit
def argmin_scan_combine(v1, i1, v2, i2):
    """cummin's running (value, position): the right one where it is as small or NaN."""
    right = (v2 <= v1) | (v2 != v2)
    return tl.where(right, v2, v1), tl.where(right, i2, i1)
