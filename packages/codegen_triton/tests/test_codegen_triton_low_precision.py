"""bfloat16 and float16 kernels: loads upcast to float32, math in float32 (libdevice on float32
values), reductions accumulating in float32, one rounding on store.

Triton's interpreter converts float32 to bfloat16 by truncation (a GPU rounds to nearest even),
so on the interpreter bfloat16 results may differ from eager's by one more bfloat16 ulp; float16
conversions round to nearest on both."""

import os

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonOptions, compile, generate, verify
from kiln.loopir import lower

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes
DEVICE = os.environ.get("KILN_TRITON_TEST_DEVICE", "cpu")
LOW = [torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    return TritonOptions(cache_dir=tmp_path_factory.mktemp("triton_cache"), xblock=16)


def softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def layer_norm(x, w, b):
    centered = x - x.mean(-1, keepdim=True)
    return centered * torch.rsqrt((centered * centered).mean(-1, keepdim=True) + 1e-5) * w + b


def rms_norm(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def gelu(x):
    return 0.5 * x * (1 + torch.erf(x * 0.7071067811865476))


CASES = {softmax: [(16, 96)], layer_norm: [(16, 96), (96,), (96,)], rms_norm: [(16, 96), (96,)],
         gelu: [(16, 96)]}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("fn", list(CASES), ids=lambda f: f.__name__)
def test_low_precision_kernels_match_float64_reference_as_well_as_eager(fn, dtype, options):
    torch.manual_seed(0)
    args = [torch.randn(s).to(dtype).to(DEVICE) for s in CASES[fn]]
    kernel_graph = lower(make_fx(fn)(*args))
    module = compile(kernel_graph, options)
    verify(module)
    got = module(*args)
    reference = fn(*(a.double() for a in args))
    eager = fn(*args)
    assert got.dtype == eager.dtype == dtype
    interpreted_bf16 = dtype == torch.bfloat16 and DEVICE == "cpu"
    slack = 2.0 ** -7 * float(reference.abs().max()) if interpreted_bf16 else 0.0  # one truncated ulp
    kiln_error = float((got.double() - reference).abs().max())
    eager_error = float((eager.double() - reference).abs().max())
    assert kiln_error <= eager_error * 1.5 + slack + 1e-6, (kiln_error, eager_error)


@pytest.mark.parametrize("dtype", LOW)
def test_loads_upcast_and_stores_round(dtype, options):
    x = torch.randn(8, 16).to(dtype)
    source = generate(lower(make_fx(lambda x: (x * 3).exp().sum(-1))(x)))
    name = "tl.bfloat16" if dtype == torch.bfloat16 else "tl.float16"
    assert ".to(tl.float32)" in source  # the load, upcast
    assert f".to({name})" in source  # the store, rounded once
    assert "tl.full([XBLOCK, RBLOCK], 0, tl.float32)" in source  # the sum accumulates in float32


def test_bfloat16_sum_accumulates_in_float32(options):
    x = torch.ones(4, 4096, dtype=torch.bfloat16, device=DEVICE)
    module = compile(lower(make_fx(lambda x: x.sum(-1))(x)), options)
    assert module(x).tolist() == [4096.0] * 4  # a bfloat16 accumulator stops at 256


@pytest.mark.parametrize("dtype", LOW)
def test_pointwise_programs_of_16_bit_kernels_cover_twice_the_points(dtype, tmp_path):
    """A pointwise kernel whose inputs and outputs are all 2 bytes wide gets 2 * xblock points per
    program (each thread moves as many bytes as a float32 kernel's); one float32 value in or out
    keeps xblock. The results stay eager's, the last program masked."""
    options = TritonOptions(cache_dir=tmp_path, xblock=16)
    x = torch.randn(5, 19).to(dtype).to(DEVICE)
    for fn, expected in [(gelu, 32), (lambda x: gelu(x).float(), 16), (lambda x: gelu(x.float()), 16)]:
        module = compile(lower(make_fx(fn)(x)), options)
        (kernel,) = [n.target for n in module.graph.nodes if type(n.target).__name__ == "TritonKernel"]
        assert kernel._pointwise_xblock == expected
        torch.testing.assert_close(module(x), fn(x), atol=1e-2, rtol=1e-2)


def _pointwise_kernel(module):
    (kernel,) = [n.target for n in module.graph.nodes if type(n.target).__name__ == "TritonKernel"]
    return kernel


@pytest.mark.parametrize("registers, expected", [(None, 32), (40, 32), (48, 32), (56, 16), (107, 16)])
def test_a_16_bit_pointwise_kernel_heavy_on_registers_keeps_xblock(registers, expected, tmp_path, monkeypatch):
    """The doubled XBLOCK of a 2-byte pointwise kernel stands only where its compiled form needs
    at most `_WIDE_POINTWISE_MAX_REGISTERS` registers a thread (None: no count, the interpreter's
    case); a heavier kernel keeps xblock. The values are eager's either way."""
    from kiln.codegen_triton._internal.runtime import _WIDE_POINTWISE_MAX_REGISTERS, TritonKernel

    assert _WIDE_POINTWISE_MAX_REGISTERS == 48
    asked = []
    monkeypatch.setattr(TritonKernel, "_registers", lambda self, plan: asked.append(plan.launch["XBLOCK"]) or registers)
    x = torch.randn(5, 19).to(torch.bfloat16).to(DEVICE)
    module = compile(lower(make_fx(gelu)(x)), TritonOptions(cache_dir=tmp_path, xblock=16))
    torch.testing.assert_close(module(x), gelu(x), atol=1e-2, rtol=1e-2)
    (plan,) = _pointwise_kernel(module)._plans.values()
    assert asked == [32] and plan.launch["XBLOCK"] == expected
    assert plan.grid == (-(-95 // expected),)


def test_float32_and_short_pointwise_kernels_compile_nothing_ahead(tmp_path, monkeypatch):
    """Only a doubled XBLOCK asks for a register count: float32 kernels and 2-byte kernels whose
    points fit xblock do not compile ahead of their launch."""
    from kiln.codegen_triton._internal.runtime import TritonKernel

    asked = []
    monkeypatch.setattr(TritonKernel, "_registers", lambda self, plan: asked.append(plan) or 99)
    options = TritonOptions(cache_dir=tmp_path, xblock=16)
    for x in (torch.randn(5, 19).to(DEVICE), torch.randn(2, 8).to(torch.bfloat16).to(DEVICE)):
        module = compile(lower(make_fx(gelu)(x)), options)
        module(x)
    assert asked == []


@pytest.mark.skipif(DEVICE != "cuda", reason="register counts come from a GPU's compiled kernel")
def test_register_counts_of_compiled_kernels_pick_the_block(tmp_path):
    """On a GPU: a 16-bit pointwise kernel's register count is read from its compiled form, and its
    XBLOCK follows the rule (twice xblock at most at the limit)."""
    from kiln.codegen_triton._internal.runtime import _WIDE_POINTWISE_MAX_REGISTERS

    x = torch.randn(64, 4096, dtype=torch.bfloat16, device=DEVICE)
    options = TritonOptions(cache_dir=tmp_path)
    for fn in (gelu, lambda x: torch.sigmoid(x) * x + torch.tanh(x) * 0.5, lambda x: torch.sin(x) + torch.cos(x)):
        module = compile(lower(make_fx(fn)(x)), options)
        torch.testing.assert_close(module(x), fn(x), atol=2e-2, rtol=2e-2)
        kernel = _pointwise_kernel(module)
        (plan,) = kernel._plans.values()
        wide = {k: v for k, v in plan.launch.items() if k != "num_warps"} | {"XBLOCK": 2 * options.xblock}
        registers = kernel._registers(kernel.with_blocks(plan, wide, options.num_warps))
        assert isinstance(registers, int) and registers > 0
        expected = 2 * options.xblock if registers <= _WIDE_POINTWISE_MAX_REGISTERS else options.xblock
        assert plan.launch["XBLOCK"] == expected, (registers, plan.launch)


def test_asking_whether_a_kernel_precompiles_compiles_nothing(tmp_path, monkeypatch):
    """`can_precompile` (asked on the compiling thread, kernel by kernel) takes the heuristic's
    plan: the register count's compile happens in precompile's threads (`warmup_arguments`)."""
    from kiln.codegen_triton._internal.runtime import TritonKernel

    asked = []
    monkeypatch.setattr(TritonKernel, "_registers", lambda self, plan: asked.append(plan) or 99)
    x = torch.randn(5, 19).to(torch.bfloat16)
    options = TritonOptions(cache_dir=tmp_path, xblock=16, compile_threads=0)  # compile() precompiles nothing
    kernel = _pointwise_kernel(compile(lower(make_fx(gelu)(x)), options))
    kernel._launcher = kernel._launcher or object()  # as on a GPU: a kernel without size symbols precompiles
    assert kernel.can_precompile() and asked == [] and not kernel._plans
    args, grid, launch = kernel.warmup_arguments()
    assert len(asked) == 1 and launch["XBLOCK"] == 16 and grid == (6,)
