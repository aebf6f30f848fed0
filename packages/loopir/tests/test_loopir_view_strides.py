"""`view_strides`: a view of a strided buffer gets eager's strides, or None where eager's view
refuses (checked against torch's own `view` on permuted and sliced tensors)."""

from __future__ import annotations

import random

import pytest
import sympy
import torch

from kiln.loopir._internal.lower_views import view_strides


def _factorization(n: int, rng: random.Random) -> list[int]:
    sizes = []
    while n > 1:
        factor = rng.choice([d for d in range(2, n + 1) if n % d == 0])
        sizes.append(factor)
        n //= factor
        if rng.random() < 0.2:
            sizes.append(1)
    rng.shuffle(sizes)
    return sizes or [1]


def _ints(values) -> list[sympy.Integer]:
    return [sympy.Integer(v) for v in values]


@pytest.mark.parametrize("seed", range(4))
def test_view_strides_agree_with_torch(seed):
    rng = random.Random(seed)
    agreed = refused = 0
    for _ in range(500):
        rank = rng.randint(1, 4)
        t = torch.empty([rng.choice([1, 2, 3, 4, 6]) for _ in range(rank)])
        t = t.permute(rng.sample(range(rank), rank))
        if rng.random() < 0.3 and t.shape[-1] > 1:
            t = t[..., ::2]
        new_size = _factorization(t.numel(), rng)
        try:
            expected = t.view(new_size).stride()
        except RuntimeError:
            expected = None
        got = view_strides(_ints(t.shape), _ints(t.stride()), _ints(new_size))
        if expected is None:
            assert got is None, (t.shape, t.stride(), new_size, got)
            refused += 1
            continue
        assert got is not None, (t.shape, t.stride(), new_size)
        assert [int(g) for g, s in zip(got, new_size) if s != 1] == [e for e, s in zip(expected, new_size) if s != 1]
        agreed += 1
    assert agreed > 100 and refused > 100  # both outcomes really exercised


def test_attention_output_read_back_through_its_transpose():
    # SDPA's output [b, h, s, d] laid out as [b, s, h, d]: transpose(1, 2) then merging heads is a view.
    b, h, s, d = 4, 4, 128, 64
    stride = (s * h * d, d, h * d, 1)
    transposed_size, transposed_stride = (b, s, h, d), (stride[0], stride[2], stride[1], stride[3])
    assert view_strides(_ints(transposed_size), _ints(transposed_stride), _ints((b * s, h * d))) == (h * d, 1)
    # the same merge of a layout that really is transposed has no strides
    assert view_strides(_ints((b, h, s, d)), _ints(stride), _ints((b, h * s * d))) is None


def test_symbolic_sizes_are_left_to_index_functions():
    s0 = sympy.Symbol("s0", positive=True, integer=True)
    assert view_strides((s0, sympy.Integer(4)), (sympy.Integer(1), s0), (4 * s0,)) is None
