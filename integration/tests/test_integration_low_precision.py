"""bfloat16/float16 graphs through the backend: compiled to kernels where the codegen's
capabilities have the dtype (loopir's reference codegen here, Triton on a GPU), eager with a
reason per node where they do not (C++ for now), and `fallback=False` raising for those."""

from __future__ import annotations

import copy

import pytest
import torch

from kiln.integration import explain
from kiln.integration._internal.backend import _compile
from kiln.integration._internal.options import KilnOptions

LOW = [torch.bfloat16, torch.float16]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                               torch.nn.Linear(128, 32), torch.nn.Softmax(-1))


def _compiled(model, reports, codegen="reference"):
    def counted(gm, example_inputs):
        return _compile(gm, example_inputs, KilnOptions.create({"codegen": codegen, "fallback": False}),
                        reports.append)
    return torch.compile(model, backend=counted)


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_mlp_compiles_to_kernels_with_no_fallback(dtype):
    model, x = _mlp().to(dtype), torch.randn(16, 64).to(dtype)
    with torch.no_grad():
        report = explain(model, x, options={"codegen": "reference", "fallback": False})
        assert report.kernel_count >= 2 and not report.fallback_nodes
        reports = []
        got = _compiled(model, reports)(x)
        expected, reference = model(x), _mlp().double()(x.double())
    assert reports and all(r.compiled and r.kernels for r in reports)
    assert got.dtype == dtype
    kiln_error = float((got.double() - reference).abs().max())
    eager_error = float((expected.double() - reference).abs().max())
    assert kiln_error <= 2 * eager_error + 1e-3, (kiln_error, eager_error)


def test_autocast_mlp_compiles_to_kernels():
    model, x = _mlp(), torch.randn(16, 64)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        report = explain(model, x, options={"codegen": "reference", "fallback": False})
        reports = []
        got = _compiled(model, reports)(x)
        expected = model(x)
    assert report.kernel_count >= 2 and not report.fallback_nodes
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def test_autocast_training_step_matches_eager():
    model = _mlp()
    reference = copy.deepcopy(model)
    x, target = torch.randn(16, 64), torch.randn(16, 32)
    reports = []
    compiled = _compiled(model, reports)
    with torch.autocast("cpu", torch.bfloat16):
        loss = (compiled(x) - target).square().mean()
        expected = (reference(x) - target).square().mean()
    loss.backward()
    expected.backward()
    assert reports and all(r.compiled for r in reports) and sum(r.kernels for r in reports) >= 1
    torch.testing.assert_close(loss, expected, atol=1e-2, rtol=1e-2)
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        scale = float(want.grad.abs().max())
        assert float((got.grad - want.grad).abs().max()) <= 0.05 * scale + 1e-4, name


def test_codegen_without_the_dtype_falls_back_per_node_and_says_why(monkeypatch):
    """A codegen whose capabilities lack bfloat16 (the C++ one before issue 13) gets those nodes
    left to eager, each with the reason; fallback=False raises naming the node."""
    import dataclasses

    from kiln import loopir
    from kiln.integration._internal import codegen_registry

    no_bf16 = dataclasses.replace(loopir.REFERENCE_CODEGEN, name="nobf16", capabilities=dataclasses.replace(
        loopir.REFERENCE_CODEGEN.capabilities,
        dtypes=frozenset({torch.float32, torch.float64, torch.int64, torch.int32, torch.bool})))
    monkeypatch.setattr(codegen_registry, "registered", lambda: {**codegen_registry.BUILTIN, "nobf16": no_bf16})
    model, x = _mlp().to(torch.bfloat16), torch.randn(16, 64).to(torch.bfloat16)
    with torch.no_grad():
        report = explain(model, x, options={"codegen": "nobf16"})
        assert report.fallback_nodes
        assert all("dtype bfloat16 is not supported by the nobf16 codegen" in f.reason for f in report.fallback_nodes)
        torch._dynamo.reset()
        with pytest.raises(Exception, match=r"node '\w+' = aten\.\w+\.\w+.*dtype bfloat16 is not supported by "
                                            r"the nobf16 codegen"):
            explain(model, x, options={"codegen": "nobf16", "fallback": False})
