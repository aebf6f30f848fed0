"""Codegens as plugins: loaded from the `kiln.codegen` entry points, chosen by device or name,
and used through their capabilities only. The core backend tests run through the reference
codegen (loopir's reference evaluator, registered by loopir's own entry point) as through C++."""

from __future__ import annotations

import dataclasses
import importlib.metadata

import pytest
import torch

from kiln import codegen_cpp, codegen_triton, loopir
from kiln.integration import KilnOptions, backend, explain
from kiln.integration._internal import codegen_registry, codegens
from kiln.integration._internal.backend import _compile


def test_kiln_codegens_come_from_entry_points():
    names = {e.name: e.value for e in importlib.metadata.entry_points(group=codegen_registry.ENTRY_POINT_GROUP)}
    assert names == {"cpu": "kiln.codegen_cpp:CODEGEN", "cuda": "kiln.codegen_triton:CODEGEN",
                     "reference": "kiln.loopir:REFERENCE_CODEGEN"}
    found = codegen_registry.registered()
    assert found["cpu"] is codegen_cpp.CODEGEN and found["cuda"] is codegen_triton.CODEGEN
    assert found["reference"] is loopir.REFERENCE_CODEGEN


def test_selection_by_device_and_by_name():
    assert codegens.select("cpu", KilnOptions()).codegen.name == "cpu"
    chosen = codegens.select("cpu", KilnOptions(codegen="reference"))
    assert chosen.codegen is loopir.REFERENCE_CODEGEN and chosen.options is None
    with pytest.raises(ValueError, match="no kiln codegen serves device 'xla'"):
        codegens.select("xla", KilnOptions())


def test_codegen_options_are_built_by_the_codegen(tmp_path):
    chosen = codegens.select("cpu", KilnOptions(cache_dir=tmp_path, parallel_threshold=7, fill_uninitialized=True))
    assert chosen.options == codegen_cpp.CppOptions(cache_dir=tmp_path / "cpp", parallel_threshold=7,
                                                    fill_uninitialized=True)


def test_a_plain_compile_function_is_a_codegen_of_default_capabilities():
    plugin = codegen_registry.as_codegen("npu", lambda kernel_graph, options=None: kernel_graph.gm)
    assert plugin.devices == ("npu",) and plugin.capabilities == loopir.Capabilities()
    with pytest.raises(TypeError, match="not a kiln.loopir.Codegen"):
        codegen_registry.as_codegen("bad", 3)


def softmax_block(x, w):
    return torch.softmax(torch.relu(x @ w) * 2, -1)


def layer_norm_residual(x, y):
    return torch.nn.functional.layer_norm(x + y, (x.shape[-1],))


CORE = {
    "softmax_block": (softmax_block, lambda: (torch.randn(8, 16), torch.randn(16, 16))),
    "layer_norm_residual": (layer_norm_residual, lambda: (torch.randn(4, 6, 32), torch.randn(4, 6, 32))),
    "pointwise_and_sum": (lambda x: (x * torch.sigmoid(x) + torch.tanh(x)).sum(-1), lambda: (torch.randn(8, 32),)),
    "indexing": (lambda x, i: torch.cat([x[i], x.flip(0)]).amax(0), lambda: (torch.randn(6, 5), torch.tensor([4, 0, 2]))),
}


@pytest.mark.parametrize("name", sorted(CORE))
@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_core_graphs_through_each_codegen(codegen, name):
    fn, make_args = CORE[name]
    args = make_args()
    report = explain(fn, *args, options={"codegen": codegen, "fallback": False})
    assert report.kernel_count >= 1 and not report.fallback_nodes
    torch._dynamo.reset()
    out = torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options={"codegen": codegen, "fallback": False}))(*args)
    torch.testing.assert_close(out, fn(*args))


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_training_through_each_codegen(codegen):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    reference = __import__("copy").deepcopy(model)
    x = torch.randn(8, 16)
    reports = []

    def counted(gm, example_inputs):
        options = KilnOptions.create({"codegen": codegen, "fallback": False})
        return _compile(gm, example_inputs, options, reports.append)

    compiled = torch.compile(model, backend=counted)
    compiled(x).square().sum().backward()
    reference(x).square().sum().backward()
    assert reports and all(r.compiled for r in reports) and sum(r.kernels for r in reports) >= 1
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.grad, want.grad)


def test_capabilities_decide_the_lowering(monkeypatch):
    """A codegen without row fusion gets softmax as separate kernels; with it, one kernel."""
    no_rows = dataclasses.replace(loopir.REFERENCE_CODEGEN, name="plain", capabilities=loopir.Capabilities())
    monkeypatch.setattr(codegen_registry, "registered", lambda: {**codegen_registry.BUILTIN, "plain": no_rows})
    x = torch.randn(4, 8)
    fused = explain(lambda t: torch.softmax(t, -1), x, options={"codegen": "reference", "fallback": False})
    unfused = explain(lambda t: torch.softmax(t, -1), x, options={"codegen": "plain", "fallback": False})
    assert fused.kernel_count == 1 and unfused.kernel_count > 1


def test_custom_lowering_table_reaches_the_partitioner_and_loopir():
    """A table without relu: the partitioner keeps relu out of loopir's regions (an eager op
    between kernels), where the default table makes it a kernel."""
    table = loopir.Lowerings({op: lowering for op, lowering in loopir.default_lowerings().items()
                              if op is not torch.ops.aten.relu.default})
    assert torch.ops.aten.relu.default not in loopir.supported_ops(table)
    assert torch.ops.aten.relu.default in loopir.supported_ops()
    fn = lambda x: torch.relu(x * 2) + 1  # noqa: E731
    default = explain(fn, torch.randn(8), options={"fallback": False})
    custom = explain(fn, torch.randn(8), options={"fallback": False, "lowerings": table})
    assert not default.fallback_nodes
    assert [f.op for f in custom.fallback_nodes] == ["aten.relu.default"] and custom.kernel_count == 2


def test_every_op_loopir_lowers_is_in_decomps_loop_level_opset_or_says_why_not():
    """The contract between decomp and loopir: `loop_level()` targets what loopir lowers."""
    from kiln import decomp
    outside = loopir.supported_ops() - decomp.LOOP_LEVEL_OPS
    unexplained = sorted(str(op) for op in outside if op not in decomp.OUTSIDE_OPSET)
    assert unexplained == []
    assert not set(decomp.OUTSIDE_OPSET) & decomp.LOOP_LEVEL_OPS
    assert all(reason for reason in decomp.OUTSIDE_OPSET.values())


def test_explain_reports_structured_fusion_decisions():
    def fn(x, w):
        return torch.softmax(x @ w, -1) + 1  # softmax rows fuse; the add is a row of the same kernel

    report = explain(fn, torch.randn(8, 16), torch.randn(16, 16), options={"fallback": False})
    kinds = [(d.fused, d.kind) for d in report.fusions]
    assert (False, "first") in kinds and (True, "row") in kinds
    assert all(isinstance(d, loopir.FusionDecision) for d in report.fusions)
    assert "fused (row)" in str(report)
