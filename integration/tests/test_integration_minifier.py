"""Dynamo's accuracy minifier with backend="kiln" (issue 15): the compiled module can be deep
copied (the minifier copies it before each run), so a wrong result is caught with grad on and off."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.debug_utils import AccuracyError, backend_accuracy_fails

from kiln.codegen_cpp._internal import kernel_source, vector_source
from kiln.integration import RegionMismatchError, backend


def _plant_sin_is_cos(monkeypatch):
    """The planted C++ bug: sin computes cos, on the scalar and the vector path alike."""
    monkeypatch.setattr(kernel_source.CppHandler, "sin", kernel_source.CppHandler.cos)
    monkeypatch.setattr(vector_source.CppVectorHandler, "sin", vector_source.CppVectorHandler.cos)


def _captured_graph(fn, *args):
    captured = {}

    def recording(gm, example_inputs):
        captured["graph"] = (gm, list(example_inputs))
        return gm

    torch._dynamo.reset()
    torch.compile(fn, backend=recording)(*args)
    return captured["graph"]


def _program(model, x):
    return model(x).sin() * 2


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_repro_after_dynamo_level_4_catches_a_wrong_kernel(grad, monkeypatch, tmp_path):
    """TORCHDYNAMO_REPRO_AFTER=dynamo TORCHDYNAMO_REPRO_LEVEL=4: the wrong result raises
    AccuracyError and the minifier launcher is written (with grad on, the compiled training
    module once failed to deep-copy, which Dynamo took for an unrelated error: no repro)."""
    _plant_sin_is_cos(monkeypatch)  # C++ sin is cos
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    model = torch.nn.Linear(8, 8)
    torch._dynamo.reset()
    config = torch._dynamo.config.patch(repro_after="dynamo", repro_level=4, debug_dir_root=str(tmp_path / "debug"))
    with config, torch.set_grad_enabled(grad), pytest.raises(Exception, match="Bad accuracy detected") as raised:
        torch.compile(lambda x: _program(model, x), backend="kiln")(torch.randn(4, 8))
    assert isinstance(getattr(raised.value, "inner_exception", raised.value), AccuracyError)
    assert list((tmp_path / "debug").rglob("minifier_launcher.py"))


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("planted", [False, True], ids=["correct", "planted_bug"])
def test_accuracy_check_catches_a_wrong_kernel(grad, planted, monkeypatch, tmp_path):
    if planted:
        _plant_sin_is_cos(monkeypatch)
    model = torch.nn.Linear(8, 8)
    with torch.set_grad_enabled(grad):
        gm, example_inputs = _captured_graph(lambda x: _program(model, x), torch.randn(4, 8))

        def kiln(gm, inputs):
            return backend(gm, inputs, options={"codegen": "cpu", "fallback": False, "cache_dir": tmp_path})

        assert backend_accuracy_fails(gm, example_inputs, kiln) == planted


def test_a_compiled_training_module_deep_copies(tmp_path):
    model = torch.nn.Linear(8, 8)
    gm, example_inputs = _captured_graph(lambda x: _program(model, x), torch.randn(4, 8, requires_grad=True))
    compiled = backend(gm, example_inputs, options={"fallback": False, "cache_dir": tmp_path})
    copied = copy.deepcopy(compiled)
    x = torch.randn(4, 8, requires_grad=True)
    inputs = [x if t is example_inputs[-1] or t.shape == x.shape else t for t in example_inputs]
    out, out_copy = compiled(*inputs), copied(*inputs)
    torch.testing.assert_close(out_copy, out)
    torch.autograd.grad(out_copy[0].sum(), x)


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_repro_after_aot_level_4_checks_each_region_against_eager(grad, monkeypatch, tmp_path):
    """TORCHDYNAMO_REPRO_AFTER=aot once did nothing for kiln: at level 4 each compiled region is
    now checked against eager ATen on its first call, naming the region and the wrong kernel."""
    _plant_sin_is_cos(monkeypatch)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    model = torch.nn.Linear(8, 8)
    torch._dynamo.reset()
    config = torch._dynamo.config.patch(repro_after="aot", repro_level=4)
    with config, torch.set_grad_enabled(grad), pytest.raises(RegionMismatchError, match="kernel") as raised:
        torch.compile(lambda x: _program(model, x), backend="kiln")(torch.randn(4, 8))
    assert "sin" in str(raised.value)


def test_repro_after_aot_below_level_4_says_it_writes_no_repro():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(repro_after="aot", repro_level=2), pytest.warns(UserWarning, match="no repro"):
        torch.compile(lambda x: x.exp() + 1, backend="kiln", options={"codegen": "reference"})(torch.randn(4))
