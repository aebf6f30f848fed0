"""`narrow` with a dynamic (SymInt) start, compiled with fallback=False: every start eager accepts,
negative ones and those at each bound included, gives eager's values. A negative start reaches a
kiln region as the SymInt `start + size`, an expression of the start's symbol; the kernel graph
solves it for the symbol at run time (it raised "size symbol ... is not a size or stride of any
graph input")."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from kiln.integration import backend

PIPELINE_LOG = "kiln.integration._internal.pipeline"
_COUNTS = re.compile(r"(\d+) kernels, \d+ extern calls, \d+ ATen nodes lowered, (\d+) fell back to eager")

CASES = {
    "input": lambda x, start: x.narrow(1, start, 3) * 2,
    "computed": lambda x, start: (x.exp() + 1).narrow(1, start, 3).sum(0),
    "dim0_then_reduce": lambda x, start: x.narrow(0, start, 2).amax(-1),
}


def _compiled(fn, codegen="cpu"):
    """`fn` compiled with dynamic shapes and fallback=False, and the list of graphs kiln got."""
    graphs = []

    def kiln(gm, example_inputs):
        graphs.append(gm)
        return backend(gm, example_inputs, options={"fallback": False, "codegen": codegen})

    return torch.compile(fn, backend=kiln, dynamic=True), graphs


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_narrow_with_dynamic_start_matches_eager(name, codegen, caplog):
    fn = CASES[name]
    compiled, graphs = _compiled(fn, codegen)
    x = torch.randn(5, 10)
    length, size = (2, x.shape[0]) if name == "dim0_then_reduce" else (3, x.shape[1])
    starts = (2, -4, -size, size - length, -length, 1, -1 - length, 0)
    with caplog.at_level(logging.INFO, logger=PIPELINE_LOG):
        for start in starts:
            torch.testing.assert_close(compiled(x, start), fn(x, start), msg=f"start = {start}")
    assert len(graphs) <= 3, "a graph per start: the start was not symbolic"
    counts = [(int(k), int(f)) for k, f in _COUNTS.findall(caplog.text)]
    assert counts and all(kernels >= 1 and fallbacks == 0 for kernels, fallbacks in counts), caplog.text


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_narrow_with_dynamic_start_and_length_matches_eager(codegen):
    """The length is a symbol too: the output's size is the length's symbol, which reaches the
    region only inside the slice's end (`start + length`), solved for at run time."""
    def fn(x, start, length):
        return x[:, start:].sum(1) + x.narrow(1, start, length).sum(1)

    compiled, graphs = _compiled(fn, codegen)
    x = torch.randn(4, 10)
    for start, length in ((2, 3), (-5, 4), (-10, 2), (7, 3), (3, 5)):
        torch.testing.assert_close(compiled(x, start, length), fn(x, start, length), msg=f"{start}, {length}")
    assert len(graphs) <= 3


@pytest.mark.parametrize("start", [8, -11])
def test_narrow_past_the_end_raises_as_eager(start):
    fn = CASES["input"]
    compiled, _ = _compiled(fn)
    x = torch.randn(5, 10)
    torch.testing.assert_close(compiled(x, -4), fn(x, -4))
    with pytest.raises((RuntimeError, IndexError)) as eager:
        fn(x, start)
    with pytest.raises(RuntimeError if eager.type is RuntimeError else eager.type):
        compiled(x, start)
