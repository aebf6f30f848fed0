"""One-pass variance: codegen_triton declares the `welford` capability, loopir rewrites a
variance's second pass into a `Welford` m2 of the values its sum reduces (`lower(...,
welford=True)`), and the kernel runs both in one loop that loads each element once (each lane's
running mean, m2 and count, merged across lanes after the loop: `welford_source.py`).
Differential tests against eager (interpreter on CPU, or compiled for a GPU: see conftest.py),
and a compile for sm90 with Triton's NVIDIA backend (no GPU needed)."""

import os
import subprocess
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonOptions, compile, verify
from kiln.loopir import lower

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # numpy on masked-off lanes
              pytest.mark.filterwarnings("ignore:var_mean.*degrees of freedom:UserWarning")]  # eager, correction >= n


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("triton_cache")


def _options(cache_dir, rblock=None):
    """The launcher's default blocks (as on a GPU), or rows read `rblock` elements per step."""
    if rblock is None:
        return TritonOptions(cache_dir=cache_dir, sync_checks=True)
    return TritonOptions(cache_dir=cache_dir, sync_checks=True, reduction_xblock=2, rblock=rblock,
                         contiguous_rblock=rblock, float32_contiguous_rblock=rblock)


def var_mean(x, dim=-1, correction=1, keepdim=False):
    """var_mean as kiln's decomposition writes it (decomp's `_var_and_mean`): upcast, shift by
    the first element along `dim`, then mean and the sum of squared deviations."""
    n = x.shape[dim]
    values = x.float()
    shift = values.narrow(dim, 0, 1) if n else 0.0
    values = values - shift
    mean = values.mean(dim, keepdim=True)
    var = ((values - mean) * (values - mean)).sum(dim, keepdim=True) / max(n - correction, 0)
    mean = mean + shift
    if not keepdim:
        var, mean = var.squeeze(dim), mean.squeeze(dim)
    return var.to(x.dtype), mean.to(x.dtype)


def norm_statistics(x, dims):
    """The statistics of kiln's layer/group/batch norm decompositions, and the normalized x."""
    mean = x.mean(dims, keepdim=True)
    deviation = x - mean
    var = (deviation * deviation).mean(dims, keepdim=True)
    return deviation * torch.rsqrt(var + 1e-5), mean, var


def compile_one_pass(fn, args, options):
    kernel_graph = lower(make_fx(fn)(*args), row_temporaries=True, recompute_cheap=True, split_reductions=True,
                         welford=True)
    module = compile(kernel_graph, options)
    verify(module)
    source = module.meta["kiln_triton"].source
    assert "kiln_device.welford_combine" in source, source
    return module, source


def row_loops(source, buffer):
    """(loops over reduction ranges, loads of `buffer` inside them that move with the loop)."""
    lines = source.splitlines()
    loops = [k for k, line in enumerate(lines) if line.strip().startswith("for roffset in range")]
    loads = 0
    for start in loops:
        indent = len(lines[start]) - len(lines[start].lstrip())
        for line in lines[start + 1:]:
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            loads += f"tl.load(in_{buffer} + " in line and ("r0" in line or "rindex" in line)
    return len(loops), loads


def check(fn, args, options, rtol, atol):
    module, source = compile_one_pass(fn, args, options)
    got, want = module(*args), fn(*args)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
    return source


TOLERANCES = {torch.float32: (1e-5, 1e-6), torch.bfloat16: (1.6e-2, 1e-3), torch.float16: (2e-3, 1e-4)}


@pytest.mark.parametrize("rblock", [None, 1024])
@pytest.mark.parametrize("width", [1024, 4096, 16384])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_var_mean_reads_each_element_once(dtype, width, rblock, cache_dir):
    x = (torch.randn(2, width) * 3 + 2).to(dtype)
    source = check(lambda x: var_mean(x), (x,), _options(cache_dir, rblock), *TOLERANCES[dtype])
    torch.testing.assert_close(torch.var_mean(x, -1), var_mean(x), rtol=TOLERANCES[dtype][0], atol=0)
    assert row_loops(source, "x_1") == (1, 1), source  # one loop, the row loaded once per step


@pytest.mark.parametrize("rblock", [8, 64])
def test_transposed_input_and_strided_rows(rblock, cache_dir):
    x = torch.randn(37, 5) * 2 + 7
    options = _options(cache_dir, rblock)
    source = check(lambda x: var_mean(x.t()), (x,), options, 1e-5, 1e-6)
    assert row_loops(source, "x_1") == (1, 1)
    check(lambda x: var_mean(x, 0, keepdim=True), (x,), options, 1e-5, 1e-6)


EDGE_CASES = {
    "large mean, small spread": lambda: torch.randn(3, 300, dtype=torch.float64).mul(1e-2).add(1e4).float(),
    "near the float maximum": lambda: torch.finfo(torch.float32).max * (1 - torch.rand(3, 300) * 1e-3),
    "no elements": lambda: torch.randn(3, 0),
    "one element": lambda: torch.randn(3, 1),
    "nan, inf, -inf and inf, two infs": lambda: torch.tensor(
        [[1.0, float("nan"), 2.0], [1.0, float("inf"), 2.0], [float("-inf"), 0.0, float("inf")],
         [0.0, float("inf"), float("inf")]]).repeat(1, 11),
}


def _var_mean_with(correction, keepdim):
    return lambda x: var_mean(x, -1, correction, keepdim)


@pytest.mark.parametrize("rblock", [8, 512])  # looped, and one step per row
@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_cases_match_eager(name, rblock, cache_dir):
    x = EDGE_CASES[name]()
    for correction in (0, 1, x.shape[-1]):
        for keepdim in (False, True):
            module, _ = compile_one_pass(_var_mean_with(correction, keepdim), (x,), _options(cache_dir, rblock))
            got_var, got_mean = module(x)
            want_var, _ = torch.var_mean(x.double(), -1, correction=correction, keepdim=keepdim)
            # eager's own Welford makes the mean of a row holding an infinity NaN; kiln's mean is
            # a sum (inf - inf is met only by the variance), as torch.mean's is
            want_mean = x.double().mean(-1, keepdim=keepdim)
            torch.testing.assert_close(got_mean, want_mean.float(), rtol=1e-6, atol=0, equal_nan=True)
            torch.testing.assert_close(got_var, want_var.float(), rtol=1e-4, atol=0, equal_nan=True)


@pytest.mark.parametrize("rblock", [8, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_norm_statistics_share_the_pass(dtype, rblock, cache_dir):
    x = (torch.randn(2, 4, 5, 6) * 2 + 3).to(dtype)
    options = _options(cache_dir, rblock)
    rtol, atol = TOLERANCES[dtype]
    layer = check(lambda x: (norm_statistics(x.float(), [-1])[0].to(dtype),), (x,), options, rtol, 10 * rtol)
    assert row_loops(layer, "x_1")[1] == 2  # the statistics' loop, then the normalized row's
    torch.testing.assert_close(norm_statistics(x.float(), [-1])[0].to(dtype),
                               torch.nn.functional.layer_norm(x.float(), [6]).to(dtype))
    check(lambda x: norm_statistics(x.float().reshape(2, 2, -1), [2])[1:], (x,), options, 1e-5, 1e-5)
    check(lambda x: norm_statistics(x.float(), [0, 2, 3])[1:], (x,), options, 1e-5, 1e-5)  # batch norm's


@pytest.mark.parametrize("rblock", [16, 512])
@pytest.mark.parametrize("offset, spread", [(1e4, 1e-2), (1e6, 1e-1), (-3e5, 1.0)])
def test_norm_variance_of_offset_rows_is_accurate(offset, spread, rblock, cache_dir):
    # unshifted two passes lose digits to the mean's rounding (5.7e-4 relative at 1e4 +- 1e-2, 8e-5
    # at 1e6 +- 0.1); the Welford lanes' shift by their first values keeps them
    x = torch.randn(3, 400, dtype=torch.float64).mul(spread).add(offset).float()
    module, _ = compile_one_pass(lambda x: norm_statistics(x, [-1])[1:], (x,), _options(cache_dir, rblock))
    mean, var = module(x)
    torch.testing.assert_close(var.double(), x.double().var(-1, correction=0, keepdim=True), rtol=1e-5, atol=0)
    torch.testing.assert_close(mean.double(), x.double().mean(-1, keepdim=True), rtol=3e-7, atol=0)


def test_two_passes_without_the_capability(cache_dir):
    x = torch.randn(3, 40)
    kernel_graph = lower(make_fx(lambda x: var_mean(x))(x), row_temporaries=True, recompute_cheap=True)
    module = compile(kernel_graph, _options(cache_dir, 8))
    assert row_loops(module.meta["kiln_triton"].source, "x_1") == (2, 2)
    torch.testing.assert_close(module(x), torch.var_mean(x, -1))


# Compiles kernel0 of the generated source `sys.argv[1]` with Triton's NVIDIA backend (no GPU
# needed) at each RBLOCK of `sys.argv[2:]`, with the launcher's 16 warps: the interpreter runs
# Python, so only a real compile checks the loop-carried row state's types and the row-first
# branch inside the loop.
COMPILE_FOR_SM90 = """
import runpy, sys
from triton import compile
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

jit = runpy.run_path(sys.argv[1])["kernel0"]
names = jit.arg_names
signature = {n: "*bf16" if n.startswith("in_") else "*fp32" if n.startswith("out_") else "i32" for n in names}
signature.update(XBLOCK="constexpr", RBLOCK="constexpr")
for rblock in map(int, sys.argv[2:]):
    constants = {(names.index("XBLOCK"),): 1, (names.index("RBLOCK"),): rblock}
    compile(ASTSource(jit, signature, constants), target=GPUTarget("cuda", 90, 32), options={"num_warps": 16})
print("compiled")
"""


def test_one_pass_kernel_compiles_for_a_gpu(cache_dir):
    pytest.importorskip("triton.backends.nvidia.compiler")
    x = torch.randn(2, 16384, dtype=torch.bfloat16)
    kernel_graph = lower(make_fx(lambda x: (var_mean(x)[0].float(), var_mean(x)[1].float()))(x),
                         row_temporaries=True, recompute_cheap=True, welford=True)
    path = compile(kernel_graph, _options(cache_dir)).meta["kiln_triton"].source_path
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90, str(path), "8192", "16384"],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-3000:]
