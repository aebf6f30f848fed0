"""Static launches (`static_launch.py`, `fast_launch.py`): which arguments reach torch's C++
launcher, typed how, and what the one-frame launch leaves to the general path. The launcher only
exists in CUDA builds of torch; here a stand-in records its calls (the real one runs in the
GPU-mode suite: KILN_TRITON_TEST_DEVICE=cuda)."""

import contextlib
import os
import types

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonCodegenError, TritonOptions, compile
from kiln.codegen_triton._internal import static_launch
from kiln.codegen_triton._internal.fast_launch import fast_launch
from kiln.codegen_triton._internal.runtime import TritonKernel
from kiln.codegen_triton._internal.static_launch import StaticLaunch, argument_plan
from kiln.loopir import lower

ON_GPU = os.environ.get("KILN_TRITON_TEST_DEVICE", "").startswith("cuda")  # see conftest.py


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


# fast_launch.py: the one-frame launch of a static kernel. CPU tensors report device -1, which
# stands in for the CUDA device here; the GPU-mode suite runs it on real kernels below.
class FakeStatic:
    def __init__(self, kept_prefix=2):
        self.impl, self.function, self.num_warps, self.shared, self.letters = FakeImpl(), "function", 4, 0, "OOOO"
        self.kept_prefix, self.nulls = kept_prefix, (None, None)


class Knobs:
    launch_enter_hook = None


def fake_plan():
    return types.SimpleNamespace(in_meta=((torch.float32, (4,), (1,)),), sizes=(), grid=(3,),
                                 out_allocations=(((4,), (1,), torch.float32),))


def one_frame(static, knobs=None, device=-1):
    return fast_launch(fake_plan(), static, -1, knobs or Knobs(), lambda d: 7,
                       lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype, device="cpu"),
                       lambda: device)


def test_fast_launch_passes_inputs_outputs_and_null_scratch():
    static = FakeStatic()
    x = torch.randn(4, device="cpu")
    (out,) = one_frame(static)((x,))
    ((function, gx, gy, gz, warps, shared, letters, args, stream),) = static.impl.launched
    assert (function, gx, gy, gz, warps, stream) == ("function", 3, 1, 1, 4, 7)
    assert args[0] is x and args[1] is out and args[2:] == (None, None) and out.shape == (4,)


def test_fast_launch_passes_an_input_as_the_output_stored_into_it():
    """A kernel's `input_stores` (an output written into an input's memory: a mutated input, a
    dead matmul result): that input is the output, nothing is allocated for it."""
    static, allocated = FakeStatic(kept_prefix=4), []
    plan = types.SimpleNamespace(in_meta=((torch.float32, (4,), (1,)),) * 2, sizes=(), grid=(3,),
                                 out_allocations=(((4,), (1,), torch.float32),) * 2)

    def allocate(size, stride, dtype):
        allocated.append(size)
        return torch.empty_strided(size, stride, dtype=dtype, device="cpu")

    launch = fast_launch(plan, static, -1, Knobs(), lambda d: 7, allocate, lambda: -1, stored=((0, 1),))
    x, y = torch.randn(4, device="cpu"), torch.randn(4, device="cpu")  # the GPU-mode suite's default is CUDA
    first, second = launch((x, y))
    assert first is y and second is not x and allocated == [(4,)]
    ((*_, args, _stream),) = static.impl.launched
    assert args[:4] == (x, y, y, second)


def test_fast_launch_of_a_checked_kernel_passes_its_status_and_asserts_after_the_launch():
    """A kernel with run-time checks (asynchronous: not `sync_checks`) takes its one zeroed
    status buffer after the sizes, and the assert on it runs after each launch."""
    static, asserted = FakeStatic(kept_prefix=3), []
    status = torch.zeros(1, dtype=torch.int32, device="cpu")
    launch = fast_launch(fake_plan(), static, -1, Knobs(), lambda d: 7,
                         lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype, device="cpu"),
                         lambda: -1, checked=(status, lambda st: asserted.append((st, len(static.impl.launched)))))
    x = torch.randn(4, device="cpu")
    for calls in (1, 2):
        (out,) = launch((x,))
        assert len(asserted) == calls and asserted[-1][0] is status and asserted[-1][1] == calls  # after it
    ((*_, args, _stream), _) = static.impl.launched
    assert args[0] is x and args[2] is status and args[3:] == (None, None)
    # without the status among the compiled arguments (another argument layout): no fast path
    assert fast_launch(fake_plan(), FakeStatic(kept_prefix=2), -1, Knobs(), lambda d: 7, None, lambda: -1,
                       checked=(status, print)) is None


class Hooked:
    launch_enter_hook = types.SimpleNamespace(calls=[print])  # a profiler's hook chain


@pytest.mark.parametrize("case", ["dtype", "stride", "shape", "misaligned", "not_a_tensor", "device", "hook",
                                  "deterministic"])
@pytest.mark.parametrize("after_a_launch", [False, True], ids=["first", "guarded"])
def test_fast_launch_leaves_what_it_was_not_specialized_for_to_the_general_path(case, after_a_launch):
    """Refused on a first call (the complete Python check) and after a launch went through
    (its one C++ layout check, `layout_guard`, built from the first inputs: a no there still
    leaves it to the complete check, and alignment is checked either way)."""
    static = FakeStatic()
    launch = one_frame(static, Hooked() if case == "hook" else None, 0 if case == "device" else -1)
    with torch.device("cpu"):  # the GPU-mode suite's default device is CUDA
        if after_a_launch and case not in ("hook", "device"):
            assert launch((torch.zeros(4),)) is not None and len(static.impl.launched) == 1
            static.impl.launched.clear()
        x = {"dtype": torch.zeros(4, dtype=torch.float64), "stride": torch.zeros(8)[::2], "shape": torch.zeros(5),
             "misaligned": torch.zeros(5)[1:], "not_a_tensor": [0.0] * 4}.get(case, torch.zeros(4))
    with _deterministic(case == "deterministic"):
        assert launch((x,)) is None
    assert static.impl.launched == []


@contextlib.contextmanager
def _deterministic(on):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def test_no_fast_launch_when_the_launcher_reorders_arguments():
    assert one_frame(FakeStatic(kept_prefix=None)) is None


@pytest.mark.skipif(not ON_GPU, reason="static launches need a CUDA build and a GPU: the GPU-mode suite runs this")
def test_static_kernels_launch_in_one_frame_after_the_static_launch_went_through(tmp_path):
    module = compile(lower(make_fx(lambda x: torch.sigmoid(x) * 3)(torch.randn(64, 33))), TritonOptions(cache_dir=tmp_path))
    (kernel,) = [n.target for n in module.graph.nodes if isinstance(n.target, TritonKernel)]
    x = torch.randn(64, 33)
    for _ in range(3):  # Triton's launch (compiles), then the static launch proves itself
        torch.testing.assert_close(module(x), torch.sigmoid(x) * 3)
    assert callable(kernel._fast)
    fast, launched = kernel._fast, []
    kernel._fast = lambda inputs: launched.append(fast(inputs)) or launched[-1]
    torch.testing.assert_close(module(x), torch.sigmoid(x) * 3)
    assert launched[0] is not None  # the one-frame launch ran it
    misaligned = torch.randn(64 * 33 + 1)[1:].view(64, 33)  # another Triton specialization: general path
    torch.testing.assert_close(module(misaligned), torch.sigmoid(misaligned) * 3)
    with pytest.raises(TritonCodegenError, match="strides"):  # the general path's check names it
        kernel(torch.randn(33, 64).t())


@pytest.mark.skipif(not ON_GPU, reason="static launches need a CUDA build and a GPU: the GPU-mode suite runs this")
@pytest.mark.parametrize("sync_checks", [False, True])
def test_checked_kernels_launch_in_one_frame_unless_their_checks_are_synchronous(tmp_path, sync_checks):
    """An index's bounds check: asynchronous (the default), the kernel takes the fast path with
    its one status buffer; `sync_checks` (eager's exception, waiting) keeps the general path."""
    x, i = torch.randn(5, 3), torch.tensor([0, 4, 2, 1])
    graph = lower(make_fx(lambda x, i: x[i] * 2)(x, i))
    module = compile(graph, TritonOptions(cache_dir=tmp_path, sync_checks=sync_checks))
    (kernel,) = [n.target for n in module.graph.nodes if isinstance(n.target, TritonKernel)]
    assert kernel.checks
    for _ in range(3):
        torch.testing.assert_close(module(x, i), x[i] * 2)
    assert callable(kernel._fast) != sync_checks
    if sync_checks:
        with pytest.raises(IndexError, match="out of bounds"):
            module(x, torch.tensor([0, 5, 2, 1]))
