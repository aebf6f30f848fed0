"""A fixed-seed slice of the differential fuzzer (tools/fuzz.py; `nox -s fuzz` runs thousands):
random programs through the C++ codegen and the Triton interpreter, static and dynamic shapes,
`fallback=False`, compared with eager."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest
import torch

FUZZ_PATH = pathlib.Path(__file__).resolve().parents[2] / "tools" / "fuzz.py"


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("kiln_fuzz", FUZZ_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_generated_programs_are_valid_eager_code_and_deterministic(fuzz):
    for seed in range(20):
        program = fuzz.generate(seed)
        assert program == fuzz.generate(seed)
        program.function()(*program.make_inputs())  # every line was kept because eager ran it
        assert "bfloat16" not in fuzz.generate(seed, bfloat16=False).source()


def test_a_planted_wrong_result_is_reported(fuzz, monkeypatch):
    """The comparison can fail: kiln's outputs made different from eager's are caught."""
    program = fuzz.Program(7, [((4, 5), "float32")], ["v0 = torch.sin(x0)"], ["v0"])
    original = fuzz.explain

    def explain_then_perturb(fn, *args, **kwargs):
        report = original(fn, *args, **kwargs)
        args[0].add_(1e-2)  # an input "mutated" by the compiled code: eager's is untouched
        return report

    monkeypatch.setattr(fuzz, "explain", explain_then_perturb)
    outcome = fuzz.run_one(program, "cpu", dynamic=False)
    assert outcome.kind == "wrong" and "output 1" in outcome.detail


def test_fixed_seed_slice_has_no_wrong_results(fuzz):
    outcomes = [outcome for _, outcome in fuzz.fuzz(programs=16, seed=15)]
    summary = fuzz.summarize(outcomes)
    wrong = [o for o in outcomes if o.kind == "wrong"]
    assert not wrong, summary + "\n" + "\n".join(f"seed {o.seed}: {o.detail}" for o in wrong)
    assert {(o.codegen, o.dynamic) for o in outcomes} == {("cpu", False), ("cpu", True), ("cuda", False),
                                                          ("cuda", True)}
    assert sum(o.kind == "ok" for o in outcomes) >= 12, summary  # kernels really ran and matched
    torch._dynamo.reset()
