"""`TritonOptions.autotune` (mode="max-autotune"): candidates around the heuristic's blocks, each
computing the same result; the fastest kept, and reused from disk by a later kernel object.
Under Triton's interpreter there is no GPU time: a fake timer picks the winner."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonOptions, compile
from kiln.codegen_triton._internal import autotune
from kiln.codegen_triton._internal.runtime import TritonKernel
from kiln.loopir import lower

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes

CASES = {
    "pointwise": (lambda x: torch.sigmoid(x) * 2 + x, (torch.randn(3000),)),
    "row reduction": (lambda x: x - x.amax(-1, keepdim=True), (torch.randn(3, 40),)),
    "column reduction": (lambda x: x.sum(0), (torch.randn(40, 3),)),
    "tile": (lambda x: x.t() + 1, (torch.randn(50, 40),)),
}


def _kernels(module):
    return [n.target for n in module.graph.nodes if isinstance(n.target, TritonKernel)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_candidate_computes_the_same_and_the_fastest_is_kept(case, tmp_path, monkeypatch):
    fn, args = CASES[case]
    seen = []

    def fake_timer(launch, candidate):
        launch()  # each candidate really runs on the interpreter
        seen.append(candidate)
        return 1.0 if len(seen) == 2 else 2.0  # the second candidate "wins"

    monkeypatch.setattr(autotune, "measure_override", fake_timer)
    module = compile(lower(make_fx(fn)(*args)), TritonOptions(cache_dir=tmp_path, autotune=True))
    (kernel,) = _kernels(module)
    (plan,) = kernel._plans.values() if kernel._plans else (None,)
    assert plan is None
    torch.testing.assert_close(module(*args), fn(*args))
    (plan,) = kernel._plans.values()
    configs = autotune.candidates(kernel, seen[0])  # seen[0]: the heuristic's own plan
    if kernel.persistent:  # its source has no loop over the row: every candidate takes it whole
        assert all(blocks["RBLOCK"] >= plan.rnumel for blocks, _ in configs)
    assert 2 <= len(seen) == len(configs) <= autotune.MAX_CANDIDATES
    assert plan.tuned and plan.launch == seen[1].launch != seen[0].launch
    results = []
    for candidate in seen:  # each configuration's outputs equal the heuristic's
        outputs = [torch.empty_strided(size, stride, dtype=dtype) for size, stride, dtype in plan.out_allocations]
        kernel.launch_plan(candidate, args, outputs)
        results.append(outputs)
    for outputs in results[1:]:
        torch.testing.assert_close(outputs, results[0])

    # a new kernel object (another process) reads the choice from the cache: no timing
    monkeypatch.setattr(autotune, "measure_override", lambda launch, candidate: pytest.fail("timed again"))
    again = compile(lower(make_fx(fn)(*args)), TritonOptions(cache_dir=tmp_path, autotune=True))
    torch.testing.assert_close(again(*args), fn(*args))
    (plan_again,) = _kernels(again)[0]._plans.values()
    assert plan_again.launch == plan.launch and plan_again.tuned


def test_a_failing_candidate_is_skipped_and_off_means_heuristics(tmp_path, monkeypatch):
    fn, args = CASES["row reduction"]

    def timer(launch, candidate):
        if candidate.launch["num_warps"] != autotune_heuristic_warps[0]:
            raise RuntimeError("out of resources")  # as Triton's OutOfResources would
        launch()
        return 1.0

    autotune_heuristic_warps = []
    module = compile(lower(make_fx(fn)(*args)), TritonOptions(cache_dir=tmp_path))
    module(*args)
    (heuristic,) = _kernels(module)[0]._plans.values()
    assert not heuristic.tuned
    autotune_heuristic_warps.append(heuristic.launch["num_warps"])
    monkeypatch.setattr(autotune, "measure_override", timer)
    tuned = compile(lower(make_fx(fn)(*args)), TritonOptions(cache_dir=tmp_path / "other", autotune=True))
    torch.testing.assert_close(tuned(*args), fn(*args))
    (plan,) = _kernels(tuned)[0]._plans.values()
    assert plan.tuned and plan.launch["num_warps"] == heuristic.launch["num_warps"]


def test_kernels_with_checks_keep_the_heuristic(tmp_path):
    def gather(x, i):
        return x[i] * 2

    args = (torch.randn(10, 4), torch.tensor([1, 9, 0]))
    module = compile(lower(make_fx(gather)(*args)), TritonOptions(cache_dir=tmp_path, autotune=True))
    torch.testing.assert_close(module(*args), gather(*args))
    (kernel,) = _kernels(module)
    assert kernel.checks and autotune.candidates(kernel, next(iter(kernel._plans.values()))) == []
