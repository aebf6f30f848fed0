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
    wrong = [o for o in outcomes if o.kind in fuzz.FAILING]  # wrong values or wrong strides
    assert not wrong, summary + "\n" + "\n".join(f"seed {o.seed}: {o.detail}" for o in wrong)
    assert {(o.codegen, o.dynamic) for o in outcomes} == {("cpu", False), ("cpu", True), ("cuda", False),
                                                          ("cuda", True)}
    assert sum(o.kind == "ok" for o in outcomes) >= 12, summary  # kernels really ran and matched
    torch._dynamo.reset()


# Programs the fuzzer found kiln failing on, each fixed: (inputs, lines, outputs, codegen, dynamic).
REGRESSIONS = {
    # Triton: a load at a constant index tensor (no loop variable) under a block mask
    "triton_load_at_a_constant_index": ([((2,), "float32")], ["v0 = x0[torch.tensor([1])] * x0[0]",
                                                              "v1 = v0.cumsum(-1)"], ["v0", "v1"], "cuda", True),
    # Triton: sympy's Mod(39 - m, 2) became Mod(1 - m, 2), negative for m > 1, printed as Triton's
    # truncating % (a wrong value)
    "triton_mod_of_a_negative_dividend": ([((2, 2, 2, 5), "float32", "channels_last")],
                                          ["v0 = x0.transpose(-2, 3)", "v1 = v0.reshape(-1)",
                                           "v2 = torch.cat([v1, v1.flip(-1)], -1)", "v3 = torch.sigmoid(v2)"],
                                          ["v3", "v0"], "cuda", False),
    # strides: eager's roll keeps its input's memory format, torch's meta kernel (the graph's
    # fake values) gives a contiguous tensor
    "roll_keeps_channels_last_cpu": ([((4, 5, 4, 4), "float32", "channels_last")],
                                     ["v0 = x0.roll(1, -2)", "v1 = x0.roll((1, 2), (0, 1))"], ["v0", "v1"], "cpu", False),
    "roll_keeps_channels_last_triton_dynamic": ([((2, 3, 4, 5), "float32", "channels_last")], ["v0 = x0.roll(1, 0)"],
                                                ["v0"], "cuda", True),
}


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_programs_the_fuzzer_found_failing_now_match_eager(fuzz, name):
    inputs, lines, outputs, codegen, dynamic = REGRESSIONS[name]
    outcome = fuzz.run_one(fuzz.Program(3, inputs, lines, outputs), codegen, dynamic)
    assert outcome.kind == "ok", f"{outcome.kind}: {outcome.category} {outcome.detail}"


def test_strides_are_compared_with_a_layout_in_the_mix(fuzz):
    """Inputs come in channels-last and transposed layouts, and an output whose significant
    strides differ from eager's is reported (here: kiln's strides replaced by contiguous ones)."""
    layouts = {spec[2] for seed in range(60) for spec in fuzz.generate(seed).inputs}
    assert layouts == {"contiguous", "channels_last", "transposed"}
    x = fuzz.laid_out(torch.randn(2, 3, 4, 5), "channels_last")
    assert fuzz._compare_strides([x.contiguous()], [x], []) == (
        "a computed output's layout differs", "output 0 [2, 3, 4, 5]: strides (60, 20, 5, 1) where eager gives "
        "(60, 1, 15, 3)")
    assert fuzz._compare_strides([x * 1], [x], []) is None


def test_cpp_row_buffer_read_outside_its_row_loop(fuzz):
    # Was a strict xfail (a kernel read row_buf4[r0] outside any row loop): since codegen_cpp
    # lowers with arithmetic recompute the max's value is recomputed, not a row buffer, so the
    # program runs; the codegen's row-buffer placement itself is fixed separately.
    program = fuzz.Program(22001026, [((1,), "float32"), ((1,), "float32")],
                           ["x1[0].zero_()", "v0 = x0.max(-1, keepdim=True)[0]", "v1 = torch.lerp(v0, x1, 0.3)"],
                           ["v1"])
    outcome = fuzz.run_one(program, "cpu", dynamic=False)
    assert outcome.kind == "ok", f"{outcome.kind}: {outcome.category}"
