"""Outputs stored into the inputs they are the new values of (`LowerOptions.input_writes`):
made where safe, refused elsewhere; either way the input ends up holding the value."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.decomp import loop_level
from kiln.loopir import lower, stored_positions, verify


def _written(fn, *args, writes=((0, 0),)):
    """Lower `fn`, run it on copies of `args` (reference evaluator) and, as a caller does, copy
    each write not stored in place; check outputs and the written input; return the positions
    stored in place."""
    kg = lower(make_fx(fn)(*args), input_writes=writes)
    verify(kg)
    inputs = [a.clone() for a in args]
    outputs = kg(*inputs)
    expected = fn(*args)
    for got, want in zip(outputs, expected):
        torch.testing.assert_close(got, want)
    stored = stored_positions(kg.gm)
    for out, into in writes:
        if out not in stored:
            inputs[into].copy_(outputs[out])
    torch.testing.assert_close(inputs[writes[-1][1]], expected[writes[-1][0]], check_dtype=False)
    assert all(outputs[out] is inputs[into] for out, into in stored.items())
    stored_kernels = [k for k in kg.kernels if k.stored_inputs]
    assert len(stored_kernels) == len(stored)
    return stored


def running_mean_update(rm, x):
    return (rm * 0.9 + x.mean(0) * 0.1, x.sum(0))


def written_without_reading(x, y):
    return (y * 2, y + 1)


def test_safe_writes_are_stored_by_their_kernel():
    assert _written(running_mean_update, torch.randn(8), torch.randn(4, 8)) == {0: 0}
    assert _written(written_without_reading, torch.randn(4, 8), torch.randn(4, 8)) == {0: 0}


@pytest.mark.parametrize("fn", [
    lambda x: ((x.flip(0) + 1),),  # reads other elements than it stores
    lambda x: (x * 2, x.t()),  # another output views the input
    lambda x: (x + 1, x.sum(1) * 2),  # another node (a reduction) reads the input
    lambda x: ((x * 2).to(torch.float64),),  # another dtype
    lambda x: (x,),  # the input passed through: no kernel computes it
], ids=["other_index", "output_views_input", "other_reader", "dtype", "pass_through"])
def test_unsafe_writes_stay_the_callers_copies(fn):
    assert _written(fn, torch.randn(4, 8)) == {}


def test_two_writes_into_one_input_are_refused():
    assert _written(lambda x: (x + 1, x + 2), torch.randn(4, 8), writes=((0, 0), (1, 0))) == {}


# A pointwise node storing into a dead matmul or kernel output it reads
# (`LowerOptions.reuse_extern_outputs`).

def _reuse_stores(fn, *args, reuse=True, targets="matmul") -> list[tuple[str, str]]:
    """Lower `fn` (loop-level decompositions) with extern-output reuse, check the kernel graph
    and its values against eager (reference evaluator, twice), and return the stores made as
    (node, dead result) pairs; every target is a `targets` ("matmul" or "kernel") output."""
    kg = lower(make_fx(fn, decomposition_table=loop_level())(*args), reuse_extern_outputs=reuse)
    verify(kg)
    for _ in range(2):
        for got, want in zip(kg(*args), fn(*args)):
            torch.testing.assert_close(got, want)
    producers = ({e.spec.name for e in kg.externs} if targets == "matmul"
                 else {o.name for k in kg.kernels for o in k.outputs})
    stores = [pair for k in kg.kernels for pair in k.stored_inputs]
    assert all(into in producers for _, into in stores)
    return stores


def _mats():
    g = torch.Generator().manual_seed(0)
    return torch.randn(16, 8, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)


def _gated(x, w1, w2):
    return (torch.nn.functional.silu(x @ w1) * (x @ w2),)


def test_a_pointwise_node_stores_into_the_dead_matmul_output_it_reads():
    assert len(_reuse_stores(_gated, *_mats())) == 1
    assert _reuse_stores(_gated, *_mats(), reuse=False) == []  # only when asked for


def _returned_too(x, w1, w2):
    a = x @ w1
    return torch.relu(a) * 2, a


def _read_later(x, w1, w2):
    a = x @ w1
    return ((torch.relu(a) * 2) @ a.t(),)


def _stored_elsewhere(x, w1, w2):
    return (torch.relu((x @ w1)[:, :8]).t() * 2,)


def _reduced(x, w1, w2):
    return (torch.relu(x @ w1).sum(1),)


@pytest.mark.parametrize("fn", [_returned_too, _read_later, _stored_elsewhere, _reduced])
def test_no_store_into_a_matmul_output_that_stays_alive_or_is_read_elsewhere(fn):
    assert _reuse_stores(fn, *_mats()) == []


def _scan_then_pointwise(x):
    return (x.cumsum(1) * 2 + 1,)  # the scan's kernel, then a pointwise kernel reading its result


def _softmax_of_softmax(x):
    return (torch.softmax(torch.softmax(x, -1) * 3, 0),)


@pytest.mark.parametrize("fn", [_scan_then_pointwise, _softmax_of_softmax])
def test_a_pointwise_node_stores_into_a_dead_kernel_output_it_reads(fn):
    assert len(_reuse_stores(fn, torch.randn(16, 24), targets="kernel")) == 1


def _returned(x):
    c = x.cumsum(1)
    return c * 2, c


def _read_by_a_later_kernel(x):
    c = x.cumsum(1)
    d = c * 2  # its own kernel (a scan's result is read by later kernels), before the next one
    return (d.cumsum(0) + c,)  # c read again after d's kernel: d may not overwrite it


def _read_transposed(x):
    c = x.cumsum(1)
    return ((c * 2).t().contiguous(),)


@pytest.mark.parametrize("fn", [_returned, _read_by_a_later_kernel, _read_transposed])
def test_no_store_into_a_kernel_output_that_stays_alive_or_is_read_elsewhere(fn):
    scan_result = "buf0"  # x.cumsum(1): the first kernel's
    assert all(into != scan_result for _, into in _reuse_stores(fn, torch.randn(16, 24), targets="kernel"))


def test_writes_into_a_graph_input_and_into_dead_kernel_outputs_together():
    """An output its kernel stores into a graph input's memory (`input_writes`) is returned as
    that input, never a dead result to write over; the scan's result, dead after the last
    kernel reads it, is."""
    def fn(x, y):
        m = x * 2  # x's new value, stored into x by its kernel
        return m, m.cumsum(1) * m

    x, y = torch.randn(16, 24), torch.randn(16, 24)
    kg = lower(make_fx(fn)(x, y), input_writes=((0, 0),), reuse_extern_outputs=True)
    assert stored_positions(kg.gm) == {0: 0}
    scan = next(k for k in kg.kernels if k.inputs and [i.name for i in k.inputs] == [kg.kernels[0].outputs[0].name])
    stores = [pair for k in kg.kernels for pair in k.stored_inputs]
    assert stores == [(kg.kernels[0].outputs[0].name, "x_1"), (kg.kernels[-1].outputs[0].name, scan.outputs[0].name)]
    inputs = [x.clone(), y]
    got = kg(*inputs)
    torch.testing.assert_close(got[1], fn(x, y)[1])
    torch.testing.assert_close(inputs[0], x * 2)


# A scatter writing into its dead base (`LowerOptions.scatter_into_dead_bases`).

def _scatter_stores(fn, *args, scatters=True) -> list[tuple[str, str]]:
    """Lower `fn` with scatters into dead bases, check it against eager (reference evaluator)
    and return the stores made as (scatter node, base) pairs."""
    kg = lower(make_fx(fn, decomposition_table=loop_level())(*args), scatter_into_dead_bases=scatters)
    verify(kg)
    for got, want in zip(kg(*args), fn(*args)):
        torch.testing.assert_close(got, want)
    stores = [pair for k in kg.kernels for pair in k.stored_inputs]
    scatters_of = {n.name: n.body.base for k in kg.kernels for n in k.nodes if hasattr(n.body, "base")}
    assert all(scatters_of.get(node) == base for node, base in stores)
    return stores


def _embedding_grad(g, ids):
    return (torch.ops.aten.embedding_dense_backward(g, ids, 10, -1, False),)


def _ids_and_grads():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(2, 6, 4, generator=gen), torch.randint(0, 10, (2, 6), generator=gen)


def test_an_embedding_gradient_scatters_into_its_zero_fill():
    """The gradient's zeros (a fill kernel's output, read by nothing else) become the scatter's
    buffer: a fill and the scatter, no copy of the zeros."""
    g, ids = _ids_and_grads()
    assert len(_scatter_stores(_embedding_grad, g, ids)) == 1
    assert _scatter_stores(_embedding_grad, g, ids, scatters=False) == []  # only when asked for


def _base_read_later(x, i, v):
    z = x * 2
    return (z.index_put((i,), v, accumulate=True) + z,)


def _base_returned(x, i, v):
    z = x * 2
    return z.index_put((i,), v, accumulate=True), z


def _base_is_the_source(x, i, v):
    z = x * 2
    return (z.scatter(0, i[:, None].expand(-1, 4), z[:3]),)  # reads the elements it may overwrite


def _base_is_an_input(x, i, v):
    return (x.index_put((i,), v, accumulate=True),)


def _scatter_args():
    return torch.randn(5, 4), torch.tensor([4, 0, 4]), torch.randn(3, 4)


@pytest.mark.parametrize("fn", [_base_read_later, _base_returned, _base_is_the_source])
def test_no_scatter_into_a_base_that_stays_alive_or_is_read_as_its_source(fn):
    assert _scatter_stores(fn, *_scatter_args()) == []


def test_a_scatter_into_a_graph_input_writes_into_its_copy_never_into_the_input():
    """An input base is copied by a kernel first (`lower_scatter._base_buffer`); the scatter then
    writes into that copy (dead after it), so the input is copied once, not twice."""
    stores = _scatter_stores(_base_is_an_input, *_scatter_args())
    assert len(stores) == 1 and not stores[0][1].startswith("x")
