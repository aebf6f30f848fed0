"""Symbolic (dynamic) integer indices follow eager's rules at run time: negative values wrap,
out-of-range values raise (issue 19's silent wrong result: `a[n] = -1` wrote nothing for n < 0)."""

from __future__ import annotations

import os

import pytest
import torch

from kiln.integration import backend


def setitem(a, n):
    a = a.clone()
    a[n] = -1
    return a


def select(a, n):
    return a[n] * 2 + a[0]


def column(a, n):
    return a.view(7, 1).expand(7, 3)[n] + 1


CASES = {"setitem": setitem, "select": select, "select_of_expand": column}


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_dynamic_index_of_every_sign_matches_eager(name, codegen):
    fn = CASES[name]
    calls = []

    def counted(gm, example_inputs):
        calls.append(gm)
        return backend(gm, example_inputs, options={"fallback": False, "codegen": codegen})

    compiled = torch.compile(fn, backend=counted, dynamic=True)
    a = torch.arange(7.0)
    for n in (2, 5, -7, -1, 6, -3, 0):
        torch.testing.assert_close(compiled(a, n), fn(a, n), msg=f"n = {n}")
    assert 1 <= len(calls) <= 2  # one static graph at most, then one dynamic graph for every n


# --------------------------------------------------------------------------- every sign and bound
# setitem, select, slice and index with a symbolic int, against eager: values where eager
# returns, the same exception type where eager raises (out of range). Dynamo guards some of
# them on the sign of n (a slice's length depends on it), so a few graphs compile; each is
# checked to take n as a SymInt (`takes_symbolic_n`), so the kernels index with a symbol.


def set_slice(a, n):
    a = a.clone()
    a[n:] = 5
    return a


def set_column(a, n):
    a = a.clone()
    a[:, n] = a[:, 0] * 3
    return a


PROPERTY_CASES = {
    "setitem": setitem, "set_column": set_column, "select": select, "select_column": lambda a, n: a[:, n] + 1,
    "slice_start": lambda a, n: a[n:] * 2, "slice_end": lambda a, n: a[:n] + 1,
    "slice_both": lambda a, n: a[n:-1] - a[0], "set_slice": set_slice,
    "index": lambda a, n: a[torch.tensor([n, 0])] + 1,
}
BOUNDS = (-100, -8, -7, -6, -3, -1, 0, 1, 2, 6, 7, 8, 100)  # every sign, each side of every bound of 7 rows


def _outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - compared with eager's below
        return exc


def _check_like_eager(compiled, fn, a, n):
    expected, got = _outcome(fn, a, n), _outcome(compiled, a, n)
    if isinstance(expected, Exception):
        assert isinstance(got, type(expected)), f"n = {n}: eager raised {expected!r}, kiln gave {got!r}"
    else:
        assert not isinstance(got, Exception), f"n = {n}: kiln raised {got!r}"
        torch.testing.assert_close(got, expected, msg=lambda m: f"n = {n}: {m}")


# CI runs fewer random examples (the fixed BOUNDS sweep above covers every sign and bound there);
# KILN_PROPERTY_EXAMPLES sets how many by hand.
PROPERTY_EXAMPLES = int(os.environ.get("KILN_PROPERTY_EXAMPLES", 10 if os.environ.get("CI") else 25))
RECOMPILE_LIMIT = 32  # Dynamo guards on n's sign and its relation to the rows: several graphs


def _under_recompile_limit(graphs: int) -> bool:
    """Past Dynamo's recompile limit later calls run eagerly and would pass without kiln."""
    return graphs < RECOMPILE_LIMIT


class _SymbolicN:
    """A backend that compiles with kiln and records whether each graph took n as a SymInt."""

    def __init__(self, codegen):
        self.codegen, self.symbolic = codegen, []

    def __call__(self, gm, example_inputs):
        n = next(node for node in gm.graph.nodes if node.op == "placeholder" and node.name.lower().startswith("l_n"))
        self.symbolic.append(isinstance(n.meta.get("example_value"), torch.SymInt))
        return backend(gm, example_inputs, options={"fallback": False, "codegen": self.codegen})


@pytest.mark.parametrize("name", ["index", "select_column", "set_slice", "setitem", "slice_both"])  # CI time
@torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT)
def test_every_sign_and_bound_matches_eager_on_cpp(name):
    fn, counted = PROPERTY_CASES[name], _SymbolicN("cpu")
    compiled = torch.compile(fn, backend=counted, dynamic=True)
    a = torch.arange(28.0).view(7, 4)
    for n in BOUNDS:
        _check_like_eager(compiled, fn, a, n)
    assert any(counted.symbolic), "no graph took n as a SymInt"
    assert _under_recompile_limit(len(counted.symbolic)), f"{len(counted.symbolic)} graphs: some calls ran eagerly"


@pytest.mark.parametrize("name", sorted(PROPERTY_CASES))
@torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT)
def test_symbolic_indices_property(name):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    fn, counted = PROPERTY_CASES[name], _SymbolicN("reference")
    compiled = torch.compile(fn, backend=counted, dynamic=True)

    @hypothesis.settings(max_examples=PROPERTY_EXAMPLES, deadline=None, database=None)
    @hypothesis.given(rows=st.integers(2, 9), n=st.integers(-12, 12) | st.sampled_from([-1000, 1000]))
    def matches_eager(rows, n):
        _check_like_eager(compiled, fn, torch.arange(rows * 4.0).view(rows, 4), n)

    matches_eager()
    assert any(counted.symbolic), "no graph took n as a SymInt"
    assert _under_recompile_limit(len(counted.symbolic)), f"{len(counted.symbolic)} graphs: some calls ran eagerly"
