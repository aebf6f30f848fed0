"""Run-time checks in generated Triton: an out-of-range indirect index raises IndexError after
the launch (loads at it are masked, nothing is read out of bounds) with `sync_checks`; without
it, on a GPU, a failed check is a device-side assert and no launch waits for its kernel;
integer division or remainder by zero does not raise (as eager on CUDA) and gives 0."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonOptions, compile, generate
from kiln.loopir import lower

ON_GPU = os.environ.get("KILN_TRITON_TEST_DEVICE", "").startswith("cuda")  # see conftest.py

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes

INDEXING = {
    "index": lambda x, i: x[i] * 2,
    "index_select": lambda x, i: torch.index_select(x, 0, i),
    "gather": lambda x, i: torch.gather(x, 0, i.view(-1, 1).expand(-1, 3)),
    "gather_sum": lambda x, i: torch.gather(x, 0, i.view(-1, 1).expand(-1, 3)).sum(0),
    "scalar_index": lambda x, i: x[i[:1]],
}


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    return TritonOptions(cache_dir=tmp_path_factory.mktemp("triton_cache"), xblock=4, sync_checks=True)


def build(fn, *args, options):
    return compile(lower(make_fx(fn, tracing_mode="fake")(*args)), options)


@pytest.mark.parametrize("name", INDEXING)
@pytest.mark.parametrize("bad", [5, 1 << 40, -6, -(1 << 40)])
def test_out_of_range_index_raises(name, bad, options):
    x, fn = torch.randn(5, 3), INDEXING[name]
    # valid negative indices wrap as in eager (index_select and gather refuse them in eager)
    good = torch.tensor([-1, 0, -5, 2, 4]) if name in ("index", "scalar_index") else torch.tensor([0, 4, 4, 2, 1])
    module = build(fn, x, good, options=options)
    torch.testing.assert_close(module(x, good), fn(x, good))
    bad_index = torch.tensor([bad, 1, 2, bad, 3]) if name == "scalar_index" else torch.tensor([0, 1, 2, bad, 3])
    with pytest.raises((IndexError, RuntimeError)):
        fn(x.cpu(), bad_index.cpu())  # eager refuses it too (on CPU: a CUDA assert is fatal)
    with pytest.raises(IndexError, match=r"kernel0: buffer buf\d+ \(from \w+\): an index is out of bounds for "
                                         r"a dimension of size 5"):
        module(x, bad_index)
    torch.testing.assert_close(module(x, good), fn(x, good))  # a fresh status buffer per call


def _triton_kernels(module):
    return [node.target for node in module.graph.nodes if type(node.target).__name__ == "TritonKernel"]


@pytest.mark.skipif(ON_GPU, reason="on a GPU the failed check is a device-side assert, fatal to this process: "
                                    "the subprocess test below covers it")
def test_without_sync_checks_a_failed_check_asserts_asynchronously(tmp_path):
    """The path a GPU takes without `sync_checks`: `torch._assert_async` on the status. On CPU
    tensors that assert raises at once, which shows its message; under the interpreter the
    launch itself always checks synchronously (IndexError)."""
    x, i, bad = torch.randn(5, 3), torch.tensor([0, 4, 4, 2, 1]), torch.tensor([0, 1, 2, 7, 3])
    module = build(INDEXING["index_select"], x, i, options=TritonOptions(cache_dir=tmp_path, xblock=4))
    with pytest.raises(IndexError, match="out of bounds"):
        module(x, bad)
    (kernel,) = _triton_kernels(module)
    kernel.interpreted = False  # take the GPU's path on CPU tensors
    with pytest.raises(RuntimeError, match=r"run-time check of Triton kernel kernel0 failed \(IndexError: "
                                           r"buffer buf\d+ .*out of bounds.*sync_checks=True"):
        module(x, bad)
    torch.testing.assert_close(module(x, i), torch.index_select(x, 0, i))
    kernel.checks *= 20  # many checks: the message stays within torch._assert_async's 254 characters on CUDA
    del kernel.__dict__["_async_message"]
    assert len(kernel._async_message) <= 254 and kernel._async_message.endswith("for eager's exception")


@pytest.mark.skipif(not ON_GPU, reason="device-side asserts and host synchronization exist on a GPU only")
def test_on_a_gpu_checked_kernels_never_wait_and_a_failure_is_a_device_assert(tmp_path):
    x, i = torch.randn(5, 3), torch.tensor([0, 4, 4, 2, 1])
    module = build(INDEXING["index_select"], x, i, options=TritonOptions(cache_dir=tmp_path, xblock=4))
    module(x, i)  # first launch compiles
    torch.cuda.set_sync_debug_mode("error")  # any host-device synchronization raises
    try:
        got = module(x, i)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got, torch.index_select(x, 0, i))
    script = textwrap.dedent(f"""
        import torch
        from torch.fx.experimental.proxy_tensor import make_fx
        from kiln.codegen_triton import TritonOptions, compile
        from kiln.loopir import lower
        fn = lambda x, i: torch.index_select(x, 0, i)
        x, i = torch.randn(5, 3, device="cuda"), torch.tensor([0, 9], device="cuda")
        module = compile(lower(make_fx(fn, tracing_mode="fake")(x, i)), TritonOptions(cache_dir={str(tmp_path)!r}))
        module(x, i)
        torch.cuda.synchronize()
        print("no error")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "no error" not in done.stdout, done.stdout + done.stderr
    assert "device-side assert" in done.stderr or "Assertion" in done.stderr, done.stderr[-2000:]


def test_index_into_an_empty_dim_raises(options):
    module = build(INDEXING["index"], torch.randn(0, 3), torch.tensor([0]), options=options)
    with pytest.raises(IndexError, match="dimension of size 0"):
        module(torch.randn(0, 3), torch.tensor([-1]))


def test_only_kernels_with_indirect_indices_take_a_status_buffer():
    source = generate(lower(make_fx(INDEXING["index"])(torch.randn(5, 3), torch.tensor([1]))))
    assert "def kernel0(in_i_1, in_x_1, out_buf0, kiln_status, XBLOCK: tl.constexpr)" in source
    assert "tl.load(in_x_1 + (i1 + 3*ind0), xmask & inside_ind0)" in source  # masked by the range check
    assert "kiln_status" not in generate(lower(make_fx(lambda x: x * 2)(torch.randn(3))))


DIVISIONS = {
    "floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": torch.remainder,
    "fmod": torch.fmod,
}


@pytest.mark.parametrize("name", DIVISIONS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_division_by_zero_gives_zero(name, dtype, options):
    fn = DIVISIONS[name]
    a, b = torch.arange(-20, 20, dtype=dtype), torch.arange(40, dtype=dtype) % 7 - 3
    got = build(fn, a, b, options=options)(a, b)
    safe = torch.where(b == 0, torch.ones_like(b), b)
    torch.testing.assert_close(got, torch.where(b == 0, torch.zeros_like(a), fn(a, safe)))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_smallest_integer_divided_by_minus_one_wraps(dtype, options):
    smallest = torch.iinfo(dtype).min
    a, b = torch.tensor([smallest, 7, smallest], dtype=dtype), torch.tensor([-1, -1, 3], dtype=dtype)
    got = build(DIVISIONS["trunc"], a, b, options=options)(a, b)
    torch.testing.assert_close(got, torch.tensor([smallest, -7, -(-smallest // 3)], dtype=dtype))
    for name in ("floor", "remainder", "fmod"):
        torch.testing.assert_close(build(DIVISIONS[name], a, b, options=options)(a, b), DIVISIONS[name](a, b))
