"""Row nodes (loopir's default `fuse_rows=True`): pointwise work over a reduction's rows runs
in its own loop inside the reduction's kernel and is read back from memory by later loops;
row temporaries (`lower(..., row_temporaries=True)`) are recomputed where they are loaded.
Differential tests against eager (interpreter on CPU, or compiled for a GPU: see conftest.py)."""

import dataclasses

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonCodegenError, TritonOptions, compile, generate, verify
from kiln.loopir import lower
from kiln.loopir.codegen import shared_reduction_loops

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    # Small blocks: several programs, several chunks per row (float32 rows too), partly masked
    # last chunks.
    # sync_checks: a failed check raises IndexError on a GPU too (not a device-side assert)
    return TritonOptions(cache_dir=tmp_path_factory.mktemp("triton_cache"), reduction_xblock=4, rblock=8,
                        contiguous_rblock=8, float32_contiguous_rblock=8, sync_checks=True)


def softmax(x):
    e = torch.exp(x - torch.amax(x, -1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def layer_norm(x, weight, bias):
    mean = x.mean(-1, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keepdim=True)
    return centered * torch.rsqrt(var + 1e-5) * weight + bias


def compile_rows(fn, args, options, tracing_mode="real", rows=True, row_temporaries=False):
    kernel_graph = lower(make_fx(fn, tracing_mode=tracing_mode)(*args), row_temporaries=row_temporaries)
    assert not rows or any(k.is_row(n) for k in kernel_graph.kernels for n in k.nodes), "nothing was fused as a row"
    module = compile(kernel_graph, options)
    verify(module)
    return module, kernel_graph


def check(fn, args, options, rows=True, row_temporaries=False, **tolerances):
    module, kernel_graph = compile_rows(fn, args, options, rows=rows, row_temporaries=row_temporaries)
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


# Row temporaries: row nodes no other kernel reads are not outputs; every later loop that loads
# one recomputes it (no store, no read back, no barrier).


def check_temporaries(fn, args, options, count=1, **tolerances):
    """`check` with row temporaries; the kernel has `count` of them, none stored or read back."""
    module, kernel_graph = check(fn, args, options, row_temporaries=True, **tolerances)
    (kernel,) = kernel_graph.kernels
    assert len(kernel.row_temporaries) == count
    source = module.meta["kiln_triton"].source
    for temporary in kernel.row_temporaries:
        assert f"out_{temporary.name}" not in source
        assert f"# {temporary.spec}  (from {', '.join(temporary.origins)}): row temporary" in source
    joined = sum(len(nodes) - 1 for nodes in shared_reduction_loops(kernel).values())  # reductions sharing a loop
    assert source.count("rnumel, RBLOCK)") == len(kernel.nodes) - count - joined  # no loop of their own
    return module, kernel


def test_softmax_row_temporary_is_recomputed_not_stored(options):
    x = torch.randn(7, 13) * 3
    x[2, 4] = float("nan")
    x[3] = float("-inf")  # NaN rows, as in eager
    x[5, :6] = float("-inf")
    module, kernel = check_temporaries(softmax, (x,), options)
    source = module.meta["kiln_triton"].source
    assert "tl.debug_barrier()" not in source and source.count("tl.exp(") == 2  # in the sum and the division
    (stored,) = lower(make_fx(softmax)(x)).kernels
    assert len(kernel.outputs) == 1 < len(stored.outputs)


def test_softmax_float64_row_temporary(options):
    check_temporaries(softmax, (torch.randn(5, 21, dtype=torch.float64),), options, rtol=1e-12, atol=1e-14)


def test_layer_norm_row_temporary_with_dynamic_shapes(options):
    args = (torch.randn(4, 9), torch.randn(9), torch.randn(9))
    module, kernel_graph = compile_rows(layer_norm, args, options, tracing_mode="symbolic", row_temporaries=True)
    (kernel,) = kernel_graph.kernels
    assert kernel.symbols and len(kernel.row_temporaries) == 1 and len(kernel.outputs) == 1
    assert f"out_{kernel.row_temporaries[0].name}" not in module.meta["kiln_triton"].source
    for rows, cols in [(4, 9), (7, 33), (2, 1), (1, 8), (5, 17)]:
        args = (torch.randn(rows, cols) * 2 + 1, torch.randn(cols), torch.randn(cols))
        torch.testing.assert_close(module(*args), layer_norm(*args))


def test_row_temporary_over_two_row_dims(options):
    def softmax_2d(x):
        e = (x - x.amax((1, 2), keepdim=True)).exp()
        return e / e.sum((1, 2), keepdim=True)

    x = torch.randn(3, 4, 5)
    x[1, 2, 3] = float("nan")
    _, kernel = check_temporaries(softmax_2d, (x,), options)
    assert len(kernel.row_ranges) == 2


def test_one_dimensional_softmax_row_temporary(options):
    for n in (8, 37):
        check_temporaries(softmax, (torch.randn(n),), options)


def test_chain_of_row_temporaries(options):
    def chain(x):  # c reads e; the last two loops recompute both
        e = torch.exp(x - x.amax(-1, keepdim=True))
        c = e - e.sum(-1, keepdim=True) / x.shape[-1]
        return c / (c * c).sum(-1, keepdim=True)

    module, _ = check_temporaries(chain, (torch.randn(6, 11),), options, count=2)
    assert module.meta["kiln_triton"].source.count("tl.exp(") == 3


def test_row_output_and_row_temporary_in_one_kernel(options):
    def fn(x):  # e is returned (stored, read back after a barrier); c is a temporary reading it
        e = torch.exp(x - x.amax(-1, keepdim=True))
        c = e - e.mean(-1, keepdim=True)
        return c / (c * c).sum(-1, keepdim=True), e

    module, kernel_graph = check(fn, (torch.randn(5, 10),), options, row_temporaries=True)
    (kernel,) = kernel_graph.kernels
    (temporary,) = kernel.row_temporaries
    source = module.meta["kiln_triton"].source
    assert f"out_{temporary.name}" not in source and source.count("tl.debug_barrier()") == 1


def test_row_temporary_with_an_indirect_index(options):
    def fn(x, w, i):  # the gather is part of the temporary: each loop that recomputes it checks i
        e = torch.exp(x - x.amax(-1, keepdim=True)) * torch.index_select(w, 0, i)
        return e / e.sum(-1, keepdim=True)

    # positive weights: with mixed signs the row sums can nearly cancel, and the quotient then
    # amplifies the last-bit differences of the GPU's exp (rel. 2e-5 seen on an H200)
    x, w, good = torch.randn(6, 5), torch.rand(5) + 0.5, torch.tensor([4, 0, -1, 2, 1])
    module, kernel = check_temporaries(fn, (x, w, good.abs()), options)
    assert module.meta["kiln_triton"].source.count("inside_ind") == 4  # defined and used, in two loops
    torch.testing.assert_close(module(x, w, good.abs()), fn(x, w, good.abs()))
    (temporary,) = kernel.row_temporaries
    for bad in (torch.tensor([4, 0, 2, 5, 1]), good):  # index_select refuses negative indices, as eager
        with pytest.raises(IndexError, match=f"{kernel.name}: buffer {temporary.name} .*out of bounds for a "
                                             "dimension of size 5"):
            module(x, w, bad)
    torch.testing.assert_close(module(x, w, good.abs()), fn(x, w, good.abs()))


def _softmax_kernel_graph():
    return lower(make_fx(softmax)(torch.randn(4, 8)), row_temporaries=True)


def _replace_node(kernel_graph, position, **body_changes):
    (kernel,) = kernel_graph.kernels
    node = kernel.nodes[position]
    nodes = list(kernel.nodes)
    nodes[position] = dataclasses.replace(node, body=dataclasses.replace(node.body, **body_changes))
    return dataclasses.replace(kernel_graph, kernels=(dataclasses.replace(kernel, nodes=tuple(nodes)),)), kernel


def test_row_temporary_read_elsewhere_than_stored_is_refused():
    kernel_graph = _softmax_kernel_graph()
    (temporary,) = kernel_graph.kernels[0].row_temporaries

    def shifted(ops, index):  # the next element of the row: not what this iteration computes
        return ops.load(temporary.name, 8 * index[0] + index[1] + 1)

    bad, _ = _replace_node(kernel_graph, -1, inner_fn=shifted)
    with pytest.raises(TritonCodegenError, match=f"reads row temporary {temporary.name} at 8\\*i0 \\+ r0 \\+ 1"):
        generate(bad)


def test_row_temporary_read_in_a_loop_over_other_ranges_is_refused():
    # The sum's loop runs r0 over 16, the temporary's rows over 8: r0 means another element.
    bad, kernel = _replace_node(_softmax_kernel_graph(), 2, reduction_ranges=(sympy.Integer(16),))
    (temporary,) = kernel.row_temporaries
    with pytest.raises(TritonCodegenError, match=f"row temporary {temporary.name}, whose rows run over \\[8\\], "
                                                 "in a loop over \\[16\\]"):
        generate(bad)


def test_masked_safe_softmax_through_a_merged_view(options):
    def fn(scores, mask):  # aten._safe_softmax as torch decomposes it
        x = scores + mask
        e = (x - x.amax(-1, keepdim=True)).exp()
        masked = (x == float("-inf")).all(-1, keepdim=True)
        return torch.where(masked, 0.0, e / e.sum(-1, keepdim=True)).view(6, 8, 8)

    mask = torch.where(torch.rand(2, 1, 8, 8) > 0.3, 0.0, float("-inf"))
    mask[0, 0, 1] = float("-inf")
    module, kernel = check_temporaries(fn, (torch.randn(2, 3, 8, 8), mask), options, count=2)
    assert kernel.is_row(kernel.nodes[-1]) and kernel.nodes[-1].ranges != kernel.nodes[0].ranges  # merged dims


@pytest.mark.parametrize("rows", [8, 7])  # reduction_xblock=4 divides 8 (constant mask), not 7 (the compare)
def test_rows_read_contiguously_drop_the_row_mask_when_the_block_divides(options, rows):
    """A static row count: `xmask` is a constant all-true mask where XBLOCK divides it (the test
    is a compile-time one), so Triton drops it from loads and stores (H200: bf16 softmax over
    16384-wide rows 70.1 -> 76.2% of copy); values are eager's either way. Strided reductions
    (a sum over dim 0) and symbolic row counts keep the compare."""
    module, _ = check(softmax, (torch.randn(rows, 13) * 3,), options)
    source = module.meta["kiln_triton"].source
    assert "if xnumel % XBLOCK == 0:" in source and "xmask = tl.full([XBLOCK, 1], True, tl.int1)" in source
    strided, _ = compile_rows(lambda x: x.sum(0), (torch.randn(rows, 13),), options, rows=False)
    assert "if xnumel % XBLOCK == 0:" not in strided.meta["kiln_triton"].source
    symbolic, _ = compile_rows(softmax, (torch.randn(rows, 13),), options, tracing_mode="symbolic")
    assert "if xnumel % XBLOCK == 0:" not in symbolic.meta["kiln_triton"].source
