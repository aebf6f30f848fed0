"""2-D tiled pointwise kernels (`tiling.py`): a kernel that loads along one dim and stores
along another runs over YBLOCK x XBLOCK tiles; every other kernel keeps one flat program axis."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonOptions, compile, generate
from kiln.loopir import lower

TILED = {
    "transpose_add": (lambda x, y: x.t() + y, lambda: (torch.randn(37, 50), torch.randn(50, 37))),
    "permute_copy": (lambda x: x.permute(0, 2, 1).contiguous() * 2, lambda: (torch.randn(3, 40, 33),)),
    "channels_last": (lambda x: x.contiguous(memory_format=torch.channels_last).sigmoid(),
                      lambda: (torch.randn(2, 24, 5, 18),)),
    "int_transpose": (lambda x: x.t().contiguous() + 3, lambda: (torch.randint(-9, 9, (70, 17)),)),
}
FLAT = {
    "contiguous_add": (lambda x, y: x + y, lambda: (torch.randn(40, 33), torch.randn(40, 33))),
    "broadcast_row": (lambda x, y: x + y, lambda: (torch.randn(40, 33), torch.randn(33))),
    "permuted_pointwise": (lambda x: x.permute(0, 2, 1, 3) + 1, lambda: (torch.randn(2, 20, 17, 8),)),
    # merged heads: the load reads runs of 16 contiguous elements (i2 % 16), no unit-stride dim
    "heads_to_rows": (lambda x: x.transpose(1, 2).reshape(2, 19, 4 * 16) + 1, lambda: (torch.randn(2, 4, 19, 16),)),
    "short_dim": (lambda x: x.t().contiguous(), lambda: (torch.randn(4, 300),)),  # 4 < 16: strided is fine
}


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    # 8x8 tiles: the test sizes span several tiles, with partial ones at both edges
    return TritonOptions(cache_dir=tmp_path_factory.mktemp("tiling"), tile_block=8)


@pytest.mark.parametrize("name", TILED)
def test_transposing_kernels_run_over_tiles_and_match_eager(name, options):
    fn, make = TILED[name]
    args = make()
    kernel_graph = lower(make_fx(fn)(*args))
    assert "YBLOCK: tl.constexpr" in generate(kernel_graph)
    got = compile(kernel_graph, options)(*args)
    got = got[0] if isinstance(got, (tuple, list)) else got
    want = fn(*args)
    torch.testing.assert_close(got, want)  # sigmoid: libdevice's, within an ulp of eager's
    assert got.stride() == want.stride()


@pytest.mark.parametrize("name", FLAT)
def test_other_pointwise_kernels_stay_flat(name, options):
    fn, make = FLAT[name]
    args = make()
    kernel_graph = lower(make_fx(fn)(*args))
    assert "YBLOCK" not in generate(kernel_graph)
    got = compile(kernel_graph, options)(*args)
    torch.testing.assert_close(got[0] if isinstance(got, (tuple, list)) else got, fn(*args), rtol=0, atol=0)


def test_symbolic_sizes_tile_too(options):
    fn = TILED["permute_copy"][0]
    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(3, 40, 33))
    kernel_graph = lower(gm)
    assert "YBLOCK: tl.constexpr" in generate(kernel_graph)
    module = compile(kernel_graph, options)
    for shape in [(3, 40, 33), (1, 17, 9), (2, 8, 64)]:
        x = torch.randn(shape)
        sizes = [s for s in shape]
        got = module(*([x] + sizes[:len(gm.graph.find_nodes(op="placeholder")) - 1]))
        torch.testing.assert_close(got[0] if isinstance(got, (tuple, list)) else got, fn(x), rtol=0, atol=0)


def test_a_constant_index_along_a_dim_outside_the_tile(options):
    """x[c] for a constant index tensor c on a dim the tile leaves to zindex: the load's address
    is one value per program, and its block mask needs a broadcast pointer (fuzz seed 25000562:
    "Mask argument cannot be block type if pointer argument is not a block")."""
    def fn(x):
        return x[torch.tensor([0, 2])].transpose(1, 2).contiguous() * 2

    x = torch.randn(3, 20, 24)
    kernel_graph = lower(make_fx(fn, tracing_mode="symbolic")(x))
    assert "YBLOCK: tl.constexpr" in generate(kernel_graph)
    torch.testing.assert_close(compile(kernel_graph, options)(x), fn(x))
