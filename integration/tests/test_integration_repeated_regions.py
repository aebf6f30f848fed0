"""Repeated regions (the layers of a transformer) are lowered under canonical names, so their
kernels have equal source and the C++ compiler builds them once."""

from __future__ import annotations

import torch

from kiln.integration import explain
from kiln.integration._internal.regions import canonical_copy


def block(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * 2 + 1).sum(-1, keepdim=True) * x


def two_blocks(x: torch.Tensor) -> torch.Tensor:
    """Two equal blocks on either side of an op loopir does not lower: two equal regions."""
    return block(torch.linalg.matrix_exp(block(x)))


def test_equal_regions_build_one_library(tmp_path):
    x = torch.randn(8, 8) / 8
    report = explain(two_blocks, x, options={"fallback": False, "cache_dir": str(tmp_path), "graph_cache": False})
    (graph,) = report.graphs
    regions = [name for name, _ in graph.stage_seconds if name.startswith("loopir:")]
    assert len(regions) == 2 and graph.kernels == 2
    assert [f.op for f in graph.fallback_nodes] == ["aten.linalg_matrix_exp.default"]
    assert len(list((tmp_path / "cpp").glob("*/kernels.so"))) == 1  # one build serves both regions
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(two_blocks, backend="kiln", options={"fallback": False})(x),
                               two_blocks(x))


def test_canonical_copy_names_inputs_by_position_and_nodes_by_op():
    def region(a, b):
        return torch.ops.aten.add.Tensor(torch.ops.aten.mul.Tensor(a, b), a)

    gm = torch.fx.symbolic_trace(region)
    for node, name in zip(gm.graph.nodes, ["arg_layer_3", "weight_7", "mul_12", "add_40"]):
        node.name = name
        node.meta["val"] = name  # metadata travels with the node
    copy = canonical_copy(gm)
    assert [(n.name, n.meta.get("val")) for n in copy.graph.nodes] == [
        ("in_0", "arg_layer_3"), ("in_1", "weight_7"), ("mul", "mul_12"), ("add", "add_40"), ("output", None)]
    a, b = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(copy(a, b), region(a, b))
