"""Debug modes that make wrong kernels loud: verify mode (`verify_calls`: compiled regions
compared with eager, naming the first kernel that differs) and `fill_uninitialized` (kernel
outputs NaN-filled before they are written). A planted bug stands in for a wrong kernel."""

from __future__ import annotations

import pytest
import torch

from kiln.codegen_cpp._internal.runtime import CompiledKernel
from kiln.integration import KilnOptions, OptionsError, RegionMismatchError, backend
from kiln.integration._internal.checked import difference


class Counting:
    def __init__(self, **options):
        self.calls = 0
        self.options = {"fallback": False, **options}

    def __call__(self, gm, example_inputs):
        self.calls += 1
        return backend(gm, example_inputs, options=self.options)


def block(x, w):
    h = torch.relu(x @ w)  # kernel0 (relu), then mm, then kernel1 (softmax)
    return torch.softmax(h @ w.t(), -1)


def plant_wrong_kernel(monkeypatch, name: str, skip_launch: bool = False):
    """Kernel `name` returns outputs with one element changed (or, with `skip_launch`, its
    generated function is not called: the runtime allocates the outputs, nothing writes them)."""
    real = CompiledKernel.__call__

    def wrong(self, *args):
        if self.__name__ != name:
            return real(self, *args)
        if skip_launch:
            monkeypatch.setattr(self, "_function", lambda *arguments: None)
            return real(self, *args)
        outputs = real(self, *args)
        outputs[0].view(-1)[3] += 1.0
        return outputs

    monkeypatch.setattr(CompiledKernel, "__call__", wrong)


def test_verify_mode_passes_correct_regions_through():
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    counting = Counting(verify_calls=2)
    compiled = torch.compile(block, backend=counting)
    for _ in range(3):  # two checked calls, then plain ones
        torch.testing.assert_close(compiled(x, w), block(x, w))
    assert counting.calls == 1


def test_verify_mode_names_the_first_kernel_that_differs(monkeypatch):
    plant_wrong_kernel(monkeypatch, "kernel1")
    compiled = torch.compile(block, backend=Counting(verify_calls=1))
    with pytest.raises(RegionMismatchError) as error:
        compiled(torch.randn(8, 16), torch.randn(16, 16))
    message = str(error.value)
    assert "region kiln_region_0" in message and "1 of 128 elements differ" in message
    assert "First kernel whose outputs differ from loopir's reference evaluator: kernel1" in message
    assert "Reduction(" in message  # the kernel's loop bodies are quoted


def test_verify_mode_checks_the_backward_of_training_graphs(monkeypatch):
    x, w = torch.randn(8, 16), torch.randn(16, 16, requires_grad=True)
    compiled = torch.compile(block, backend=Counting(verify_calls=1))
    out = compiled(x, w)  # the forward regions match; the backward is compiled on its first call
    plant_wrong_kernel(monkeypatch, "kernel0")
    with pytest.raises(RegionMismatchError, match="backward region"):
        out.sum().backward()


def test_verify_mode_stops_checking_after_its_calls(monkeypatch):
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    compiled = torch.compile(block, backend=Counting(verify_calls=1))
    compiled(x, w)
    plant_wrong_kernel(monkeypatch, "kernel1")
    assert not torch.equal(compiled(x, w), block(x, w))  # unchecked: the planted error passes


def test_fill_uninitialized_shows_elements_no_kernel_wrote(monkeypatch):
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    plant_wrong_kernel(monkeypatch, "kernel1", skip_launch=True)
    out = torch.compile(block, backend=Counting(fill_uninitialized=True))(x, w)
    assert out.isnan().all()


def test_fill_uninitialized_under_torch_deterministic_mode():
    """torch fills `torch.empty` with NaN in deterministic mode; kiln's outputs follow suit."""
    from kiln.loopir import fill_requested
    assert not fill_requested(False)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert fill_requested(False)
    finally:
        torch.use_deterministic_algorithms(previous)


def test_debug_mode_options_from_the_environment():
    options = KilnOptions.create({}, environ={"KILN_VERIFY_CALLS": "3", "KILN_FILL_UNINITIALIZED": "1"})
    assert options.verify_calls == 3 and options.fill_uninitialized
    from kiln import codegen_cpp, codegen_triton
    settings = options.codegen_settings()
    assert codegen_cpp.CODEGEN.make_options(settings).fill_uninitialized
    assert codegen_triton.CODEGEN.make_options(settings).fill_uninitialized
    with pytest.raises(OptionsError, match="KILN_VERIFY_CALLS must be an integer"):
        KilnOptions.create({}, environ={"KILN_VERIFY_CALLS": "yes"})
    with pytest.raises(OptionsError, match="verify_calls must be >= 0"):
        KilnOptions.create({"verify_calls": -1})


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, False), ({"KILN_SYNC_CHECKS": "1"}, True), ({"KILN_SYNC_CHECKS": "0"}, False),
    ({"CUDA_LAUNCH_BLOCKING": "1"}, True), ({"CUDA_LAUNCH_BLOCKING": "1", "KILN_SYNC_CHECKS": "0"}, False),
])
def test_sync_checks_from_the_environment_reach_the_triton_codegen(environ, expected):
    from kiln import codegen_triton
    options = KilnOptions.create({}, environ=environ)
    assert options.sync_checks is expected
    assert codegen_triton.CODEGEN.make_options(options.codegen_settings()).sync_checks is expected


def test_difference_rule():
    want = torch.tensor([1.0, -2.0, float("inf"), float("nan")])
    assert difference(want.clone(), want) is None
    assert difference(want + torch.tensor([1e-5, 0, 0, 0]), want) is None  # within 1e-4 of max |eager|
    assert "1 of 4 elements differ" in difference(want + torch.tensor([1e-3, 0, 0, 0]), want)
    unwritten = torch.tensor([float("nan"), -2.0, float("inf"), float("nan")])
    assert "1 of them NaN where eager's are not" in difference(unwritten, want)
    assert "elements differ" in difference(torch.tensor([1, 2]), torch.tensor([1, 3]))
    assert "where eager gives" in difference(torch.zeros(2), torch.zeros(3))
