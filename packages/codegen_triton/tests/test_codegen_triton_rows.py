"""Row nodes (loopir's default `fuse_rows=True`): pointwise work over a reduction's rows runs
in its own loop inside the reduction's kernel and is read back from memory by later loops.
Differential tests against eager (interpreter on CPU, or compiled for a GPU: see conftest.py)."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonOptions, compile, verify
from kiln.loopir import lower

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    # Small blocks: several programs, several chunks per row, partly masked last chunks.
    return TritonOptions(cache_dir=tmp_path_factory.mktemp("triton_cache"), reduction_xblock=4, rblock=8,
                        contiguous_rblock=8)


def softmax(x):
    e = torch.exp(x - torch.amax(x, -1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def layer_norm(x, weight, bias):
    mean = x.mean(-1, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keepdim=True)
    return centered * torch.rsqrt(var + 1e-5) * weight + bias


def compile_rows(fn, args, options, tracing_mode="real", rows=True):
    kernel_graph = lower(make_fx(fn, tracing_mode=tracing_mode)(*args))
    assert not rows or any(k.is_row(n) for k in kernel_graph.kernels for n in k.nodes), "nothing was fused as a row"
    module = compile(kernel_graph, options)
    verify(module)
    return module, kernel_graph


def check(fn, args, options, rows=True, **tolerances):
    module, kernel_graph = compile_rows(fn, args, options, rows=rows)
    _first = module(*args)  # compiles; on a GPU the call below launches through the direct launcher
    expected, got = fn(*args), module(*args)  # `_first` alive: fresh output memory
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, equal_nan=True, **tolerances)
    return module, kernel_graph


def test_softmax_is_one_kernel(options):
    module, kernel_graph = check(softmax, (torch.randn(7, 13) * 3,), options)
    assert len(kernel_graph.kernels) == 1
    assert module.meta["kiln_triton"].source.count("tl.debug_barrier()") == 1


def test_softmax_float64(options):
    check(softmax, (torch.randn(5, 21, dtype=torch.float64),), options, rtol=1e-12, atol=1e-14)


def test_layer_norm_with_mean_and_var(options):
    x = torch.randn(6, 19) * 2 + 1
    module, kernel_graph = check(layer_norm, (x, torch.randn(19), torch.randn(19)), options)
    assert len(kernel_graph.kernels) == 1


def test_subtract_row_max_is_not_read_back(options):
    module, _ = check(lambda x: x - x.amax(-1, keepdim=True), (torch.randn(9, 10),), options)
    assert "tl.debug_barrier()" not in module.meta["kiln_triton"].source  # nothing reads the row back


def test_rows_of_a_3d_tensor_and_a_second_output(options):
    def fn(x):
        return softmax(x), x.sum(-1) * 2

    check(fn, (torch.randn(3, 5, 11),), options)


def test_one_dimensional_full_row_softmax(options):
    for n in (1, 8, 37):  # one row: a single program; 37 spans several RBLOCK chunks
        check(softmax, (torch.randn(n),), options, rows=n > 1)  # [1]: no row loop, a plain kernel


def test_dynamic_shapes_one_compile_many_sizes(options):
    module, kernel_graph = compile_rows(softmax, (torch.randn(4, 9),), options, tracing_mode="symbolic")
    assert kernel_graph.kernels[0].symbols
    for shape in [(4, 9), (1, 30), (11, 2), (6, 16), (3, 1)]:
        x = torch.randn(*shape)
        torch.testing.assert_close(module(x), softmax(x))


def test_dynamic_layer_norm(options):
    module, _ = compile_rows(layer_norm, (torch.randn(4, 9), torch.randn(9), torch.randn(9)), options,
                             tracing_mode="symbolic")
    for rows, cols in [(4, 9), (7, 33), (2, 1)]:
        args = (torch.randn(rows, cols), torch.randn(cols), torch.randn(cols))
        torch.testing.assert_close(module(*args), layer_norm(*args))


def test_rows_with_default_block_sizes(tmp_path):
    # One chunk per row and many rows per program: the launch options the backend uses.
    check(softmax, (torch.randn(33, 100),), TritonOptions(cache_dir=tmp_path))
