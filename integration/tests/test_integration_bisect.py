"""`kiln.integration.bisect` finds bugs planted in different stages of the pipeline."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

from kiln import autograd_trace, loopir
from kiln.codegen_cpp._internal import kernel_source, vector_source
from kiln.integration import bisect
from kiln.integration._internal import pipeline

aten = torch.ops.aten


def _plant_sin_is_cos(monkeypatch):
    """The planted C++ bug: sin computes cos, on the scalar and the vector path alike."""
    monkeypatch.setattr(kernel_source.CppHandler, "sin", kernel_source.CppHandler.cos)
    monkeypatch.setattr(vector_source.CppVectorHandler, "sin", vector_source.CppVectorHandler.cos)


def _program(x, y):
    return torch.softmax(x.sin() * y, -1) + 1


def _args():
    torch.manual_seed(0)
    return torch.randn(4, 8), torch.randn(4, 8)


def _sin_to_cos(gm: fx.GraphModule) -> fx.GraphModule:
    """The planted bug: every sin computes cos."""
    for module in gm.modules():
        if isinstance(module, fx.GraphModule):
            for node in module.graph.nodes:
                if node.target is aten.sin.default:
                    node.target = aten.cos.default
            module.recompile()
    return gm


def _assert_shrunk_to_the_sin(result):
    """The smallest node set still diverging is the planted op alone, with a repro of its own."""
    assert len(result.nodes) == 1 and re.match(r"sin = (aten\.sin\.default|sin)\(", result.nodes[0]), str(result)
    assert result.nodes_repro is not None and ".sin" in result.nodes_repro.read_text()


def test_a_correct_program_has_no_diverging_stage(tmp_path):
    result = bisect(_program, *_args(), options={"cache_dir": tmp_path})
    assert result.stage is None, str(result)
    assert [stage for stage, _ in result.checked] == ["dynamo", "aten", "decomposed", "partitioned", "reference",
                                                      "generated"]


def test_a_bug_in_the_aten_trace(monkeypatch, tmp_path):
    trace = autograd_trace.trace_inference
    monkeypatch.setattr(autograd_trace, "trace_inference", lambda gm, inputs: _sin_to_cos(trace(gm, inputs)))
    result = bisect(_program, *_args(), options={"cache_dir": tmp_path}, repro_dir=tmp_path)
    assert result.stage == "aten" and result.graph == 0, str(result)
    assert "output 0" in result.detail and "elements differ" in result.detail
    _assert_shrunk_to_the_sin(result)


def test_a_bug_in_decomposition(monkeypatch, tmp_path):
    decompose = pipeline.decompose_graph
    monkeypatch.setattr(pipeline, "decompose_graph", lambda *a: _sin_to_cos(decompose(*a)))
    result = bisect(_program, *_args(), options={"cache_dir": tmp_path}, repro_dir=tmp_path)
    assert result.stage == "decomposed", str(result)
    _assert_shrunk_to_the_sin(result)


def test_a_bug_in_partitioning(monkeypatch, tmp_path):
    partition_graph = pipeline.partition_graph
    monkeypatch.setattr(pipeline, "partition_graph", lambda *a: _sin_to_cos(partition_graph(*a)))
    result = bisect(_program, *_args(), options={"cache_dir": tmp_path}, repro_dir=tmp_path)
    assert result.stage == "partitioned", str(result)
    _assert_shrunk_to_the_sin(result)


def test_a_bug_in_a_loopir_lowering_names_the_region(tmp_path):
    default = loopir.default_lowerings()
    table = loopir.Lowerings({**dict(default.items()), aten.sin.default: default[aten.cos.default]})
    result = bisect(_program, *_args(), options={"cache_dir": tmp_path, "lowerings": table}, repro_dir=tmp_path)
    assert result.stage == "reference", str(result)
    assert result.region is not None and result.region.startswith("kiln_region_")
    assert "RegionMismatchError" in result.detail
    _assert_shrunk_to_the_sin(result)
    assert result.nodes_region.startswith("kiln_region_") and "RegionMismatchError" in result.nodes_detail


def test_a_bug_in_generated_code_names_the_region_and_kernel_and_writes_a_repro(monkeypatch, tmp_path):
    _plant_sin_is_cos(monkeypatch)  # C++ sin is cos
    result = bisect(_program, *_args(), options={"codegen": "cpu", "cache_dir": tmp_path}, repro_dir=tmp_path)
    assert result.stage == "generated", str(result)
    assert result.region is not None and "kernel" in result.detail
    assert dict(result.checked)["reference"] == "ok"
    _assert_shrunk_to_the_sin(result)
    assert "First kernel whose outputs differ" in result.nodes_detail  # the kernel of the node set
    # the node set's repro runs on its own (here without the planted bug: no stage differs); the
    # whole graph's is written by the same code
    assert result.repro.exists() and result.repro.with_suffix(".pt").exists()
    run = subprocess.run([sys.executable, str(result.nodes_repro)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "no stage differs from eager" in run.stdout, run.stderr[-2000:]


def _mul_of_sin_to_add(gm: fx.GraphModule) -> fx.GraphModule:
    """A planted bug needing two nodes: a mul reading a sin adds instead."""
    for node in gm.graph.nodes:
        if node.target is aten.mul.Tensor and any(a.target is aten.sin.default for a in node.all_input_nodes):
            node.target = aten.add.Tensor
    gm.recompile()
    return gm


def test_shrinking_keeps_every_node_a_bug_needs(monkeypatch, tmp_path):
    decompose = pipeline.decompose_graph
    monkeypatch.setattr(pipeline, "decompose_graph", lambda *a: _mul_of_sin_to_add(decompose(*a)))
    result = bisect(_program, *_args(), options={"cache_dir": tmp_path}, repro_dir=tmp_path)
    assert result.stage == "decomposed", str(result)
    assert [node.split(" = ")[1].split("(")[0] for node in result.nodes] == ["aten.sin.default", "aten.mul.Tensor"]


@pytest.mark.parametrize("codegen", ["cpu", "cuda"])
def test_bisect_on_a_module_with_parameters(codegen, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8)).eval()
    result = bisect(model, torch.randn(2, 8), options={"codegen": codegen, "cache_dir": tmp_path})
    assert result.stage is None, str(result)
