"""simplify_index: range-aware rewriting of FloorDiv/Mod index expressions, checked by brute force."""

from __future__ import annotations

import itertools
import math

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.loopir._internal.simplify import simplify_index
from kiln.loopir._internal.sizes import (
    FloorDiv,
    contiguous_strides,
    flat_index,
    index_vars,
    unflatten,
)


def _value(expr, env):
    """Evaluate with C semantics on non-negative values (what codegens emit)."""
    if expr.is_Integer:
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return env[expr]
    args = [_value(a, env) for a in expr.args]
    if isinstance(expr, FloorDiv):
        return args[0] // args[1]
    if isinstance(expr, sympy.Mod):
        return args[0] % args[1]
    if expr.is_Add:
        return sum(args)
    if expr.is_Mul:
        return math.prod(args)
    raise AssertionError(f"unexpected {expr!r}")


def _divisions(expr) -> int:
    return sum(1 for e in sympy.preorder_traversal(expr) if isinstance(e, (FloorDiv, sympy.Mod)))


@st.composite
def view_chains(draw):
    """A read of a permuted tensor through a reshape: the index expression views compose into."""
    source = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    order = draw(st.permutations(range(len(source))))
    permuted = [source[d] for d in order]
    strides = [contiguous_strides(source)[d] for d in order]
    # reshape the permuted tensor (as if contiguous) into a random factorization of its numel
    numel = math.prod(permuted)
    out, rest = [], numel
    while rest > 1 and len(out) < 3:
        divisors = [d for d in range(2, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        out.append(d)
        rest //= d
    out = out or [1]
    if rest > 1:
        out.append(rest)
    ivars = index_vars(len(out))
    flat = flat_index(ivars, contiguous_strides(out))
    expr = flat_index(unflatten(flat, permuted), strides)
    return expr, dict(zip(ivars, out))


@settings(max_examples=300, deadline=None)
@given(view_chains())
def test_simplified_indices_agree_on_every_point(chain):
    expr, ranges = chain
    simpler = simplify_index(expr, ranges)
    assert _divisions(simpler) <= _divisions(expr)
    names = list(ranges)
    for point in itertools.product(*(range(n) for n in ranges.values())):
        env = dict(zip(names, point))
        assert _value(simpler, env) == _value(expr, env), (expr, simpler, env)


def test_known_simplifications():
    i0, i1 = index_vars(2)
    y = i1 + 1024 * i0
    reshaped = 1024 * sympy.Mod(FloorDiv(y, 1024), 128) + 131072 * FloorDiv(y, 131072) + sympy.Mod(y, 1024)
    assert simplify_index(reshaped, {i0: 512, i1: 1024}) == y
    assert simplify_index(FloorDiv(i1, 64), {i1: 64}) == 0
    assert simplify_index(sympy.Mod(FloorDiv(256 * i0 + i1, 64), 4), {i0: 8, i1: 256}) == FloorDiv(i1, 64)
    # without ranges (symbolic sizes) nothing is assumed
    assert simplify_index(reshaped, {}) == reshaped
    # an index that may exceed the divisor stays
    assert simplify_index(sympy.Mod(i1, 64), {i1: 65}) == sympy.Mod(i1, 64)


def test_an_exact_quotient_of_sizes_is_the_quotient():
    """torch's view meta spells a size `(s0**2)//s0` (group_norm's decomposition); read as `s0`,
    layouts and sizes compare equal to the ones spelled `s0` (38000308)."""
    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    assert FloorDiv(s0**2, s0) == s0
    assert FloorDiv(s0 * s1 * 6, 3 * s1) == 2 * s0
    assert isinstance(FloorDiv(s0**2 + 1, s0), FloorDiv)  # not exact: kept
    assert isinstance(FloorDiv(s0, 2 * s1), FloorDiv)


def test_a_floor_division_of_an_exact_multiple_ends():
    """40000229 (`torch.stack([a, b])[..., ::2]`): every term divisible by the divisor left an
    empty rest, and dividing the rest again recursed without end."""
    i0, i1 = index_vars(2)
    assert simplify_index(FloorDiv(2 * i0 + 4 * i1, 2), {i0: 3, i1: 5}) == i0 + 2 * i1
    assert simplify_index(sympy.Mod(FloorDiv(6 * i0, 3), 4), {i0: 2}) == 2 * i0


def test_clamped_indices():
    """A read clamped into its source (cat, pad, slice_scatter: `Min(n - 1, i)`): a clamp that
    never binds goes (a padded bias read over the unpadded row), one that may bind stays, and a
    clamped column seen through a reshape loses its divisions."""
    i0, i1, r0 = *index_vars(2), index_vars(1, "r")[0]
    assert simplify_index(sympy.Min(30521, r0), {r0: 30522}) == r0
    assert simplify_index(sympy.Max(0, r0 - 3) + 1, {r0: 2}) == 1
    assert simplify_index(sympy.Min(30521, i1), {i1: 30528}) == sympy.Min(30521, i1)
    flat = 30522 * i0 + sympy.Min(30521, i1)
    ranges = {i0: 16, i1: 30528}
    assert simplify_index(FloorDiv(flat, 30522), ranges) == i0
    assert simplify_index(sympy.Mod(flat, 30522), ranges) == sympy.Min(30521, i1)
    assert simplify_index(30522 * FloorDiv(flat, 30522) + sympy.Mod(flat, 30522), ranges) == flat
