"""Every element of every output is written.

The GPU training-gradient bug (issue 22): a pointwise node fused into a reduction kernel
whose outer ranges hold a size-1 dim (`sum(0, keepdim=True)` beside a `[512, 64]` node, the
GQA `repeat_kv` backward's `[8, 2, 1, 512, 16]` sum beside `[8, 2, 512, 16]` nodes) was
stored with the wrong loop variable pinned to 0: most elements were never written. On a CPU
they often read as zeros (fresh pages), on a GPU as stale memory. Outputs are NaN-filled
here (`fill_uninitialized`) so an unwritten element fails a test wherever it runs, and the
codegen refuses a store that cannot reach every element.
"""

import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln.loopir._internal.ir as loopir_ir
from kiln.codegen_triton import TritonCodegenError, TritonOptions, compile, generate, verify
from kiln.loopir import lower

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    return TritonOptions(cache_dir=tmp_path_factory.mktemp("triton_cache"), reduction_xblock=4, rblock=8,
                         contiguous_rblock=8, fill_uninitialized=True)


def sum_first_beside_zeros(x):
    """BERT's position-embedding backward: a batch sum kept as [1, S, D], a zero [S, D] buffer."""
    return x.sum(0, keepdim=True), torch.full((x.shape[1], x.shape[2]), 0.5) + x[0]


def grouped_query_sum(x, tangent, cos):
    """Llama's repeat_kv backward: heads summed per kv head ([B, KV, 1, S, D]), then rope."""
    b, h, s, d = x.shape
    summed = x.view(b, 2, h // 2, s, d).sum(2, keepdim=True).view(b, 2, s, d)
    grad = tangent + summed
    return grad, grad * cos


def middle_keepdim_beside_flat(x):
    return x.sum(1, keepdim=True), (x[:, 0] * 2).view(-1)


CASES = {
    "sum_first_beside_zeros": (sum_first_beside_zeros, lambda: (torch.randn(4, 16, 8),)),
    "grouped_query_sum": (grouped_query_sum,
                          lambda: (torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(1, 1, 6, 8))),
    "middle_keepdim_beside_flat": (middle_keepdim_beside_flat, lambda: (torch.randn(3, 5, 7),)),
}


def _kernel_graph(fn, args):
    return lower(make_fx(fn)(*args), row_temporaries=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_nodes_over_fewer_dims_than_the_kernel_write_every_element(name, options):
    fn, make_args = CASES[name]
    args = make_args()
    kernel_graph = _kernel_graph(fn, args)
    # The case is what it says: one kernel holds a node over other ranges than the kernel's.
    assert any(node.ranges != kernel.ranges for kernel in kernel_graph.kernels for node in kernel.nodes)
    module = compile(kernel_graph, options)
    verify(module)
    for got, want in zip(module(*args), fn(*args)):
        assert not got.isnan().any(), "an output element was never written"
        torch.testing.assert_close(got, want)


def test_a_store_that_cannot_reach_every_element_is_refused(monkeypatch):
    """The old placement (the variable of the kernel's size-1 dim given to the node's first dim)
    is refused at code generation, on any machine, instead of leaving elements unwritten."""
    def old_placement(node, ranges, row_ranges):
        index, rindex = loopir_ir._placement(node, ranges, row_ranges)
        return tuple(0 if size == 1 else var for var, size in zip(index, ranges)), rindex

    kernel_graph = _kernel_graph(sum_first_beside_zeros, (torch.randn(4, 16, 8),))
    # Kernels without the scheduler's recorded placements work them out with `placement`.
    kernel_graph = dataclasses.replace(kernel_graph, kernels=tuple(
        dataclasses.replace(k, placements=None) for k in kernel_graph.kernels))
    monkeypatch.setattr(loopir_ir, "placement", old_placement)
    with pytest.raises(TritonCodegenError, match="would never be written"):
        generate(kernel_graph)


def test_fill_uninitialized_fills_outputs_before_the_launch(options, monkeypatch):
    """With the option on, an output the kernel does not write reads as NaN / the largest int."""
    def f(x):
        return x * 2, (x > 0).to(torch.int64)

    module = compile(_kernel_graph(f, (torch.randn(5),)), options)
    kernel = next(n.target for n in module.graph.nodes if hasattr(n.target, "jit_function"))

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    monkeypatch.setattr(kernel, "jit_function", NoLaunch())
    monkeypatch.setattr(kernel, "_launcher", None)
    floats, ints = module(torch.randn(5))
    assert floats.isnan().all() and (ints == torch.iinfo(torch.int64).max).all()
