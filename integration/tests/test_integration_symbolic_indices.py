"""Symbolic (dynamic) integer indices follow eager's rules at run time: negative values wrap,
out-of-range values raise (issue 19's silent wrong result: `a[n] = -1` wrote nothing for n < 0)."""

from __future__ import annotations

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
