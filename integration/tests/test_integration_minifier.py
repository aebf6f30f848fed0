"""Dynamo's minifier with backend="kiln" (issue 15): TORCHDYNAMO_REPRO_AFTER=dynamo and aot, levels
2-4, grad on and off. The compiled module can be deep copied (the minifier copies it before each
run), and at the aot level kiln's compiled regions write the launcher (checked.py)."""

from __future__ import annotations

import copy
import dataclasses
import re
import runpy
import sys

import pytest
import torch
from torch._dynamo.debug_utils import AccuracyError, backend_accuracy_fails

from kiln import loopir
from kiln.codegen_cpp._internal import kernel_source, vector_source
from kiln.integration import RegionMismatchError, backend
from kiln.integration._internal import codegen_registry
from kiln.loopir._internal import evaluate


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
    config = torch._dynamo.config.patch(repro_after="aot", repro_level=4, debug_dir_root=str(tmp_path / "debug"))
    with config, torch.set_grad_enabled(grad), pytest.raises(RegionMismatchError, match="kernel") as raised:
        torch.compile(lambda x: _program(model, x), backend="kiln")(torch.randn(4, 8))
    assert "sin" in str(raised.value) and "minifier_launcher.py" in str(raised.value)
    assert list((tmp_path / "debug").rglob("minifier_launcher.py"))


def test_repro_after_aot_level_1_says_it_writes_no_repro(tmp_path):
    torch._dynamo.reset()
    config = torch._dynamo.config.patch(repro_after="aot", repro_level=1, debug_dir_root=str(tmp_path))
    with config, pytest.warns(UserWarning, match="no repro"):
        torch.compile(lambda x: x.exp() + 1, backend="kiln", options={"codegen": "reference"})(torch.randn(4))


def _plant_on_the_reference_codegen(monkeypatch, crash: bool):
    """CPU graphs compile with loopir's reference evaluator (no C++ build: the minifier compiles
    many subgraphs), whose sin raises (`crash`) or computes cos."""
    def raising_sin(self, x):
        raise RuntimeError("planted crash in sin")

    monkeypatch.setattr(evaluate.TorchHandler, "sin", raising_sin if crash else evaluate.TorchHandler.cos)
    cpu = dataclasses.replace(loopir.REFERENCE_CODEGEN, name="cpu", devices=("cpu",))
    monkeypatch.setattr(codegen_registry, "registered", lambda: {**codegen_registry.BUILTIN, "cpu": cpu})


MINIFIER_CASES = [(after, level, grad) for after in ("dynamo", "aot") for level in (2, 3, 4) for grad in (False, True)]
# the cases that also run the launcher (each minification compiles ~10 subgraphs: kept to a few)
MINIFIED = {("dynamo", 2, False), ("dynamo", 4, True), ("aot", 3, True), ("aot", 4, False)}


@pytest.mark.parametrize("after, level, grad", MINIFIER_CASES,
                         ids=[f"{a}-level{lv}-{'grad' if g else 'no_grad'}" for a, lv, g in MINIFIER_CASES])
def test_the_minifier_writes_a_launcher_that_shrinks_a_planted_bug_to_one_op(after, level, grad, monkeypatch,
                                                                             tmp_path):
    """TORCHDYNAMO_REPRO_AFTER=dynamo and aot, levels 2-4, grad on and off: a planted crash
    (levels 2-3) or wrong result (level 4) in sin raises and writes Dynamo's minifier launcher;
    run, the launcher shrinks `relu(linear(x).sin() * 2)` to the sin alone (repro.py)."""
    _plant_on_the_reference_codegen(monkeypatch, crash=level < 4)
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # the minifier writes repro.py in the working directory
    model = torch.nn.Linear(8, 8)
    torch._dynamo.reset()
    config = torch._dynamo.config.patch(repro_after=after, repro_level=level, debug_dir_root=str(tmp_path / "debug"))
    with config, torch.set_grad_enabled(grad), pytest.raises(Exception) as raised:
        torch.compile(lambda x: (model(x).sin() * 2).relu(), backend="kiln", options={"fallback": False})(
            torch.randn(4, 8))
    message = str(raised.value) + "".join(getattr(raised.value, "__notes__", []))
    assert re.search("planted crash in sin|Bad accuracy detected|kiln verify: .*region", message), message
    launchers = list((tmp_path / "debug").rglob("minifier_launcher.py"))
    assert len(launchers) == 1
    if (after, level, grad) not in MINIFIED:
        return
    torch._dynamo.reset()
    monkeypatch.setattr(sys, "argv", [str(launchers[0])])
    runpy.run_path(str(launchers[0]), run_name="__main__")
    forward = (tmp_path / "repro.py").read_text().split("def forward", 1)[1].split("mod = Repro()")[0]
    calls = [line for line in forward.splitlines() if " = " in line]
    assert len(calls) == 1 and "sin" in calls[0], forward
