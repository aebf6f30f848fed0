"""Direct launches (`launch.py`): after the first launch of a specialization, `TritonKernel`
calls the compiled kernel's launcher itself. A stand-in for Triton's JITFunction / CompiledKernel
records which path each launch took and runs the real kernel, so the specialization key and the
arguments passed to the launcher are checked without a GPU."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonCodegenError, TritonOptions, compile
from kiln.codegen_triton._internal import launch
from kiln.codegen_triton._internal.runtime import TritonKernel
from kiln.loopir import lower

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


class FakeCompiledKernel:
    """What `JITFunction.run` returns: `run` is the launcher, called as JITFunction.run calls it."""

    def __init__(self, jit):
        self.jit, self.function, self.packed_metadata = jit, "function", "metadata"

    def run(self, grid0, grid1, grid2, stream, function, metadata, launch_metadata, enter, leave, *args):
        assert (grid1, grid2, stream, function, metadata) == (1, 1, 7, "function", "metadata")
        self.jit.log.append(("direct", launch_metadata))
        self.jit.real[(grid0,)](*args)  # every argument positionally, the constexprs included

    def launch_metadata(self, grid, stream, *args):
        return ("metadata of", grid, len(args))


class FakeJITFunction:
    def __init__(self, real):
        self.real, self.log = real, []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("jit", None))
            self.real[grid](*args, **kwargs)
            return FakeCompiledKernel(self)

        return run


class FakeKnobs:
    launch_enter_hook = None
    launch_exit_hook = None


@pytest.fixture
def knobs(monkeypatch):
    knobs = FakeKnobs()
    monkeypatch.setattr(launch, "_runtime", lambda: (knobs, lambda: 0, lambda device: 7))
    return knobs


def fake_kernel(fn, example, options, tracing_mode="symbolic"):
    """`fn` compiled to a one-kernel module whose kernel launches through FakeJITFunction."""
    module = compile(lower(make_fx(fn, tracing_mode=tracing_mode)(example)), options)
    (node,) = [n for n in module.graph.nodes if isinstance(n.target, TritonKernel)]
    fake = FakeJITFunction(node.target.jit_function)
    node.target = TritonKernel(node.target.kernel, fake, options, node.target.checks, node.target.index_bounds)
    module.recompile()
    return module, node.target, fake


def test_direct_launches_follow_triton_specialization(tmp_path, knobs):
    module, _, fake = fake_kernel(lambda x: x * 2 + 1, torch.randn(32), TritonOptions(cache_dir=tmp_path, xblock=16))
    base = torch.randn(200)
    calls = [
        (base[:32], "jit"),  # first launch: compiles
        (torch.randn(32), "direct"),
        (base[100:148], "direct"),  # 48: same classes (not 1, divisible by 16, 32-bit), same XBLOCK
        (base[:33], "jit"),  # 33 is not divisible by 16: another specialization
        (base[16:49], "direct"),  # 33 again, from an offset of 64 bytes
        (base[1:33], "jit"),  # a pointer not 16-byte aligned
        (base[5:37], "direct"),
        (base[:1], "jit"),  # 1 is a constexpr for Triton
    ]
    for x, path in calls:
        fake.log.clear()
        torch.testing.assert_close(module(x), x * 2 + 1)
        assert [p for p, _ in fake.log] == [path], (x.numel(), x.storage_offset())


def test_direct_launches_pass_hooks_metadata(tmp_path, knobs):
    module, kernel, fake = fake_kernel(lambda x: x.sum(-1), torch.randn(3, 20), TritonOptions(cache_dir=tmp_path))
    x = torch.randn(3, 20)
    module(x)
    knobs.launch_enter_hook = lambda metadata: None
    fake.log.clear()
    torch.testing.assert_close(module(x), x.sum(-1))
    n_args = 2 + len(kernel.kernel.symbols) + 3  # x, the output, sizes, XBLOCK, RBLOCK, INDEX_64
    assert kernel.index_bounds  # symbolic sizes: the index width is chosen at launch
    assert fake.log == [("direct", ("metadata of", (1,), n_args))]


def test_cheap_checks_still_name_bad_inputs(tmp_path, knobs):
    _, kernel, _ = fake_kernel(lambda x: x + 1, torch.randn(4, 6), TritonOptions(cache_dir=tmp_path), "real")
    (out,) = kernel(torch.randn(4, 6))
    with pytest.raises(TritonCodegenError, match="has sizes"):
        kernel(torch.randn(4, 5))
    with pytest.raises(TritonCodegenError, match="strides"):
        kernel(torch.randn(6, 4).t())
    with pytest.raises(TritonCodegenError, match="must be a torch.float32"):
        kernel(torch.randn(4, 6, dtype=torch.float64))
    with pytest.raises(TritonCodegenError, match="must be a torch.float32"):
        kernel([1.0])
    with pytest.raises(TypeError, match="takes 1 tensors and 0 sizes"):
        kernel(torch.randn(4, 6), 3)
    x = torch.randn(4, 1, 6)[:, 0]  # strides (6, 1) from a (4, 1, 6) tensor: as expected
    (out,) = kernel(x)
    torch.testing.assert_close(out, x + 1)


def test_a_launcher_that_rejects_the_arguments_turns_direct_launches_off(tmp_path, knobs, monkeypatch):
    module, kernel, fake = fake_kernel(lambda x: x - 1, torch.randn(8), TritonOptions(cache_dir=tmp_path))
    x = torch.randn(8)
    module(x)
    torch.testing.assert_close(module(x), x - 1)
    assert kernel._launcher.direct

    module, kernel, fake = fake_kernel(lambda x: x - 2, torch.randn(8), TritonOptions(cache_dir=tmp_path))

    def other_convention(self, *args):
        raise TypeError("function takes exactly 12 arguments")

    monkeypatch.setattr(FakeCompiledKernel, "run", other_convention)
    for _ in range(3):
        torch.testing.assert_close(module(x), x - 2)
    assert not kernel._launcher.direct
    assert [p for p, _ in fake.log] == ["jit", "jit", "jit"]


def test_warps_are_part_of_the_specialization_key(tmp_path, knobs):
    """Autotuning launches the same blocks with several num_warps: each must compile its own."""
    module, kernel, fake = fake_kernel(lambda x: x * 3, torch.randn(64), TritonOptions(cache_dir=tmp_path))
    x = torch.randn(64)
    module(x)
    (plan,) = kernel._plans.values()
    blocks = dict(zip([k for k in plan.launch if k != "num_warps"], plan.blocks))
    outputs = [torch.empty(64)]
    for warps, path in [(plan.launch["num_warps"], "direct"), (2 * plan.launch["num_warps"], "jit"), (2 * plan.launch["num_warps"], "direct")]:
        fake.log.clear()
        kernel.launch_plan(kernel.with_blocks(plan, blocks, warps), (x,), outputs)
        assert [p for p, _ in fake.log] == [path], warps
        torch.testing.assert_close(outputs[0], x * 3)
