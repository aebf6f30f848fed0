"""kiln's random numbers: Philox4x32-10, a counter-based generator, defined here once.

Every codegen implements exactly this definition (the reference evaluator runs the functions
below on int64 tensors), so one seed and offset give the same number on every backend: the
integer results bit for bit, `rand` bit for bit, `randn` up to each target's `log`/`cos`.

* **Key and counter.** The 64-bit `seed` is the key, ``k0 = seed & 0xffffffff`` and
  ``k1 = seed >> 32``. The 64-bit `offset` is the counter's first two words,
  ``c0 = offset & 0xffffffff`` and ``c1 = offset >> 32``; ``c2 = c3 = 0``.
* **A round** (ten of them): with ``M0 = 0xD2511F53`` and ``M1 = 0xCD9E8D57``, the new words
  are ``(hi(M1 * c2) ^ c1 ^ k0, lo(M1 * c2), hi(M0 * c0) ^ c3 ^ k1, lo(M0 * c0))``, where hi and
  lo are the halves of the 64-bit product; then the key is bumped by the Weyl constants
  ``k0 += 0x9E3779B9``, ``k1 += 0xBB67AE85`` (mod 2**32). This is Salmon et al.'s Philox4x32-10
  (SC'11), the generator of Triton's `tl.rand`, so the Triton codegen calls that.
* **rand:** the first word as an int32 ``x``; ``x = ~x`` where negative, so ``0 <= x < 2**31``;
  then ``float32(x) * 4.6566127342e-10f``, the largest scale keeping every result below 1.
* **randn:** Box-Muller on two uniforms from the first two words, ``u1 = max(u1, 1e-7)``:
  ``sqrt(-2 * log(u1)) * cos(6.2831855f * u2)``, all in float32.
* **randint64(low, high):** 63 random bits, ``(c1 & 0x7fffffff) << 32 | c0``, then
  ``low + bits % (high - low)`` (the modulo's bias is below ``(high - low) / 2**63``).

A graph draws one seed per call from torch's generator (`torch.randint`), so `manual_seed`
reproduces a run and two calls differ; its k-th random op reads offsets
``(k << STREAM_SHIFT) + flat_index``, so the ops of one graph draw disjoint streams.
"""

from __future__ import annotations

import torch

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
MASK = 0xFFFFFFFF
UNIFORM_SCALE = 4.6566127342e-10  # as float32
TWO_PI = 6.283185307179586  # as float32: 6.2831855
MIN_UNIFORM = 1.0e-7
STREAM_SHIFT = 40  # a random op of a graph draws at most 2**40 numbers
SEED_HIGH = 2**63 - 1  # seeds are drawn uniformly from [0, SEED_HIGH)


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    # a < 2**32 and m < 2**32: the int64 product wraps, but its bits are the 64-bit product's.
    product = a * m
    return (product >> 32) & MASK, product & MASK


def philox(seed: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The four 32-bit words (as int64 tensors) for `seed` and `offset` (int64 tensors)."""
    seed, offset = torch.as_tensor(seed, dtype=torch.int64), torch.as_tensor(offset, dtype=torch.int64)
    c0 = offset & MASK
    zero = torch.zeros_like(c0)
    return philox4x32((c0, (offset >> 32) & MASK, zero, zero), (seed & MASK, (seed >> 32) & MASK))


def philox4x32(counter: tuple[torch.Tensor, ...], key: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 of a counter of four 32-bit words and a key of two, held in int64 tensors."""
    (c0, c1, c2, c3), (k0, k1) = counter, key
    for _ in range(ROUNDS):
        hi1, lo1 = _mulhilo(c2, M1)
        hi0, lo0 = _mulhilo(c0, M0)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
    return c0, c1, c2, c3


def uniform(word: torch.Tensor) -> torch.Tensor:
    """A 32-bit word -> float32 in [0, 1)."""
    x = torch.where(word >= 2**31, word ^ MASK, word)  # int32's ~x for the negative ones
    return x.to(torch.float32) * torch.tensor(UNIFORM_SCALE, dtype=torch.float32)


def rand(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    return uniform(philox(seed, offset)[0])


def randn(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    c0, c1, _, _ = philox(seed, offset)
    u1 = torch.clamp_min(uniform(c0), MIN_UNIFORM)
    angle = torch.tensor(TWO_PI, dtype=torch.float32) * uniform(c1)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(angle)


def randint64(seed: torch.Tensor, offset: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    c0, c1, _, _ = philox(seed, offset)
    bits = ((c1 & 0x7FFFFFFF) << 32) | c0
    low = torch.as_tensor(low, dtype=torch.int64)
    return low + bits % (torch.as_tensor(high, dtype=torch.int64) - low)
