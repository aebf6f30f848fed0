"""Distributed training through kiln: DDP, FSDP2, compiled autograd and DDP's python_reducer.

The runs themselves are in ``distributed_runs.py`` (two processes over gloo, three SGD steps,
each compared with the same training uncompiled). The normal suite runs compiled autograd in
one process and the python_reducer mode (collectives inside kiln's backward graph) on the MLP
in two; ``nox -s distributed`` (which sets ``KILN_DISTRIBUTED=1``) runs every mode on the MLP
and on a small GPT-2.
"""

from __future__ import annotations

import operator
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from kiln.integration import KilnOptions, explain
from kiln.integration._internal.backend import _compile
from kiln.integration._internal.boxed_inputs import FlatInputs, flatten_list_inputs

# The spawned ranks import the runs by module name (pytest imports this file with importlib).
sys.path.insert(0, os.path.dirname(__file__))
import distributed_runs  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
FULL = os.environ.get("KILN_DISTRIBUTED") == "1"
full_only = pytest.mark.skipif(not FULL, reason="heavy: runs under `nox -s distributed` (KILN_DISTRIBUTED=1)")
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def check_matches_uncompiled(result: dict) -> None:
    torch.testing.assert_close(result["losses"], result["reference_losses"], **TOLERANCE)
    assert result["params"].keys() == result["reference_params"].keys()
    for name, value in result["params"].items():
        torch.testing.assert_close(value, result["reference_params"][name], **TOLERANCE, msg=name)


def check_compiled(reports: list[dict], *, forward: int = 1) -> None:
    """Every graph compiled with kernels; at least `forward` training forwards, each with its backward."""
    assert reports, "kiln compiled nothing"
    for report in reports:
        assert report["compiled"], report["text"]
        assert report["kernels"] > 0, report["text"]
    forwards = [r for r in reports if r["training"] and not r["backward"]]
    backwards = [r for r in reports if r["backward"]]
    assert len(forwards) >= forward, [r["text"] for r in reports]
    assert len(backwards) == len(forwards), [r["text"] for r in reports]


def check_collectives_in_backward(reports: list[dict]) -> None:
    """The backward pass came from compiled autograd, with DDP's all-reduces in kiln's graph."""
    backward = [r for r in reports if r["compiled_autograd"]]
    assert len(backward) == 1, [r["text"] for r in reports]
    ops = backward[0]["collectives"]
    all_reduces = ops.count("_c10d_functional.all_reduce.default")
    assert all_reduces > 0 and ops.count("_c10d_functional.wait_tensor.default") == all_reduces, ops


def check_python_reducer(results: list[dict]) -> None:
    for result in results:
        check_matches_uncompiled(result)
        reports = result["reports"]
        assert all(r["compiled"] and r["kernels"] > 0 for r in reports), [r["text"] for r in reports]
        assert any(r["training"] for r in reports), "the forward was not compiled"
        check_collectives_in_backward(reports)


# --- the normal suite: compiled autograd in one process, python_reducer on the MLP ---------------

def test_compiled_autograd_backward_through_kiln():
    result = distributed_runs.run_compiled_autograd("mlp")
    check_matches_uncompiled(result)
    reports = result["reports"]
    backward = [r for r in reports if r["compiled_autograd"]]
    assert len(backward) == 1 and backward[0]["kernels"] > 0, [r["text"] for r in reports]
    assert not backward[0]["collectives"]
    # kiln's own backward ran inside compiled autograd's graph: never compiled on its own
    assert not any(r["backward"] for r in reports)


def test_compiled_autograd_with_an_eager_forward():
    torch.manual_seed(0)
    model = distributed_runs.MLP(width=16)
    x = torch.randn(4, 8)
    kiln = distributed_runs.Recording()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend=kiln)):
        model(x).square().sum().backward()
    compiled = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model(x).square().sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(compiled[name], p.grad, **TOLERANCE, msg=name)
    (report,) = kiln.reports
    assert report.compiled_autograd and report.kernels > 0 and not report.fallback_nodes, str(report)
    assert "aten.mm.default" in report.lowered_nodes


def test_list_inputs_are_flattened_and_other_uses_of_the_list_refused():
    graph = torch.fx.Graph()
    inputs, size = graph.placeholder("inputs"), graph.placeholder("size")
    first, second = (graph.call_function(operator.getitem, (inputs, i)) for i in range(2))
    graph.output((graph.call_function(torch.add, (first, second)), size))
    gm = torch.fx.GraphModule({}, graph)
    example = [[torch.randn(3), torch.randn(3)], 7]
    flat, flat_inputs, lists, stolen = flatten_list_inputs(gm, example)
    assert [n.name for n in flat.graph.nodes if n.op == "placeholder"] == ["inputs_0", "inputs_1", "size"]
    assert len(flat_inputs) == 3 and lists == (0,) and stolen == ()
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == ["inputs", "size"]  # Dynamo's graph stays
    args = [list(example[0]), 7]
    torch.testing.assert_close(FlatInputs(flat, lists, (0,))(*args)[0], example[0][0] + example[0][1])
    assert args[0] == []  # a stolen list is cleared once flattened

    with graph.inserting_before(next(n for n in graph.nodes if n.op == "output")):
        graph.call_function(print, (inputs,))
    refused = torch.fx.GraphModule({}, graph)
    with pytest.raises(NotImplementedError, match="only indexing it"):
        flatten_list_inputs(refused, example)
    reports = []  # with the default fallback, the graph runs as Dynamo captured it, and says so
    assert _compile(refused, example, KilnOptions.create({}), reports.append) is refused
    assert not reports[0].compiled and "only indexing it" in reports[0].reason


def test_python_reducer_puts_collectives_in_kilns_backward_graph():
    results = distributed_runs.launch("python_reducer", "mlp")
    check_python_reducer(results)
    for result in results:  # the MLP's 8 gradients fit one bucket: one all-reduce (comm_buckets.py)
        (backward,) = [r for r in result["reports"] if r["compiled_autograd"]]
        assert backward["collectives"].count("_c10d_functional.all_reduce.default") == 1, backward["collectives"]


def test_explain_warns_when_dynamo_hands_kiln_no_graph():
    seq = nn.Sequential(nn.Linear(4, 4))
    with pytest.warns(UserWarning, match="no graph"):
        report = explain(torch.nn.Module.__call__, seq, torch.randn(2, 4))
    assert report.graph_count == 0


# --- nox -s distributed: every mode, the MLP and a small GPT-2 ---------------------------------

@full_only
@pytest.mark.parametrize("model", distributed_runs.MODELS)
def test_ddp(model):
    for result in distributed_runs.launch("ddp", model):
        check_matches_uncompiled(result)
        # DDPOptimizer: one graph per bucket (the MLP's blocks fill one bucket each)
        check_compiled(result["reports"], forward=3 if model == "mlp" else 1)


@full_only
@pytest.mark.parametrize("model", distributed_runs.MODELS)
def test_fsdp2_per_block_compile(model):
    for result in distributed_runs.launch("fsdp2", model):
        check_matches_uncompiled(result)
        check_compiled(result["reports"])


@full_only
def test_python_reducer_gpt2():
    check_python_reducer(distributed_runs.launch("python_reducer", "gpt2"))


@full_only
def test_compiled_autograd_gpt2():
    result = distributed_runs.run_compiled_autograd("gpt2")
    check_matches_uncompiled(result)
    assert any(r["compiled_autograd"] and r["kernels"] > 0 for r in result["reports"])
