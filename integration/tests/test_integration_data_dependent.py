"""Data-dependent sizes (issue 19): `nonzero` and `masked_select` (kept in eager, between
regions) followed by ops over their result compile once and run for every result size: the
unbacked size symbol Dynamo gives their result is a size argument of the kernels after them,
never specialized at trace time."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend

CODEGENS = ("reference", "cpu", "cuda")  # "cuda" is codegen_triton, under TRITON_INTERPRET=1 on the CPU


def nonzero_then_ops(x):
    idx = torch.nonzero(x > 0)
    return idx * 2 + 1, idx.sum(0), (x[idx[:, 0]] * 3).exp()


def masked_select_then_ops(x):
    picked = torch.masked_select(x, x > 0)
    return picked.exp() * 2, picked.sum(), picked.mean()  # the mean of nothing: NaN, as eager's


def nonzero_2d_then_gather(x):
    rows, cols = torch.nonzero(x > 0.5, as_tuple=True)
    return x[rows, cols] + rows.to(x.dtype) * 10 + cols


CASES = {"nonzero": (nonzero_then_ops, (6,)), "masked_select": (masked_select_then_ops, (6,)),
         "nonzero_2d": (nonzero_2d_then_gather, (3, 4))}


def _inputs(shape, hits):
    """A tensor of `shape` with exactly `hits` elements > 0.5 (at spread positions)."""
    x = -torch.rand(shape)
    flat = x.view(-1)
    for k in range(hits):
        flat[(k * 5) % flat.numel()] = 1.0 + k
    return x


@pytest.fixture
def capture_dynamic_output_shapes():
    """nonzero and masked_select in the graph, their result's size an unbacked symbol (by
    default Dynamo breaks the graph there, and recompiles what follows for a new size)."""
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        yield


@pytest.mark.usefixtures("capture_dynamic_output_shapes")
@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_one_compile_runs_every_result_size(name, codegen):
    fn, shape = CASES[name]
    graphs, kernels = [], []

    def counted(gm, example_inputs):
        graphs.append(gm)
        module = backend(gm, example_inputs, options={"fallback": False, "codegen": codegen})
        kernels.append(sum(1 for n in module.graph.nodes if n.op == "call_function" and n.name.startswith("kernel")))
        return module

    compiled = torch.compile(fn, backend=counted)
    for hits in (3, 0, 1, 5):
        x = _inputs(shape, hits)
        for got, expected in zip(compiled(x), fn(x)):
            torch.testing.assert_close(got, expected, equal_nan=True, msg=lambda m, hits=hits: f"{hits} hits: {m}")
    assert len(graphs) == 1, f"{len(graphs)} compiles"  # no graph break, no recompile for a new size
    assert kernels[0] >= 2  # kiln kernels before and after the data-dependent op (kept in eager)
