"""Static launches (`static_launch.py`): which arguments reach torch's C++ launcher, typed how.
The launcher only exists in CUDA builds of torch; here a stand-in records its calls (the real
one runs in the GPU-mode suite: KILN_TRITON_TEST_DEVICE=cuda)."""

import types

import pytest
import torch

from kiln.codegen_triton._internal import static_launch
from kiln.codegen_triton._internal.static_launch import StaticLaunch, argument_plan


def test_argument_plan_drops_constexprs_and_specialized_ints():
    names = ["x", "out", "n", "m", "XBLOCK"]
    signature = {"x": "*bf16", "out": "*fp32", "n": "i32", "m": "constexpr", "XBLOCK": "constexpr"}
    assert argument_plan(signature, names) == ("OOi", (0, 1, 2))
    # older Triton: constants listed apart, keyed by (position,) tuples
    assert argument_plan({0: "*fp32", 1: "i64", 2: "i32"}, ["a", "b", "c"], {(2,): 1}) == ("Ol", (0, 1))
    with pytest.raises(KeyError):
        argument_plan({"t": "nvTmaDesc"}, ["t"])


class FakeImpl:
    def __init__(self):
        self.loaded, self.launched = [], []

    def _load_kernel(self, path, name, shared, device):
        with open(path, "rb") as f:
            self.loaded.append((f.read(), name, shared, device))
        return ("function", 32, 0)  # torch 2.11's shape: (function, registers, spills)

    def _launch_kernel(self, *args):
        self.launched.append(args)


def fake_compiled(scratch=0, num_ctas=1):
    metadata = types.SimpleNamespace(name="kernel0", shared=128, num_warps=4, num_ctas=num_ctas,
                                     global_scratch_size=scratch, profile_scratch_size=0)
    source = types.SimpleNamespace(signature={"x": "*fp32", "out": "*fp32", "n": "i32", "XBLOCK": "constexpr"},
                                   fn=types.SimpleNamespace(arg_names=["x", "out", "n", "XBLOCK"]), constants={})
    return types.SimpleNamespace(metadata=metadata, asm={"cubin": b"\x7fELF cubin"}, src=source)


def test_static_launch_passes_kept_arguments_and_null_scratch(monkeypatch):
    impl = FakeImpl()
    monkeypatch.setattr(static_launch, "_launcher_impl", lambda: impl)
    launch = StaticLaunch.of(fake_compiled(), 0)
    assert impl.loaded == [(b"\x7fELF cubin", "kernel0", 128, 0)]
    x, out = torch.zeros(4), torch.zeros(4)
    launch.launch(3, 99, (x, out, 4, 256))
    ((function, gx, gy, gz, warps, shared, letters, args, stream),) = impl.launched
    assert (function, gx, gy, gz, warps, shared, stream) == ("function", 3, 1, 1, 4, 128, 99)
    # the two scratch parameters Triton >= 3.4 compiles in are null pointers; XBLOCK is not passed
    assert letters == "OOiOO" and args[:3] == (x, out, 4) and args[3:] == (None, None)


@pytest.mark.parametrize("compiled", [fake_compiled(scratch=64), fake_compiled(num_ctas=2)], ids=["scratch", "ctas"])
def test_kernels_the_launcher_cannot_run_keep_tritons(monkeypatch, compiled):
    monkeypatch.setattr(static_launch, "_launcher_impl", lambda: FakeImpl())
    assert StaticLaunch.of(compiled, 0) is None


def test_no_static_launch_without_torchs_launcher(monkeypatch):
    monkeypatch.setattr(static_launch, "_launcher_impl", lambda: None)
    assert StaticLaunch.of(fake_compiled(), 0) is None
