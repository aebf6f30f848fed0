"""Scatters as `Scatter` nodes (issue 20): structure of what `lower` builds, and the reference
evaluator against eager over the modes, dtypes, duplicate, negative and out-of-range indices."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import Scan, Scatter, lower, supported_ops, verify

aten = torch.ops.aten


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def lowered(fn, *args):
    kg = lower(make_fx(fn, tracing_mode="fake")(*args))
    verify(kg)
    return kg


def _scatter_nodes(kg):
    return [n for k in kg.kernels for n in k.nodes if isinstance(n.body, Scatter)]


X = torch.randn(5, 4, generator=_gen(0))
SRC = torch.randn(7, 4, generator=_gen(1))
INDEX = torch.randint(0, 5, (7, 4), generator=_gen(2))


def test_the_scatter_ops_are_supported():
    ops = supported_ops()
    for op in (aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce,
               aten.scatter_add.default, aten.scatter_reduce.two, aten.index_put.default, aten.index_reduce.default,
               aten.put.default, aten.masked_scatter.default):
        assert op in ops


def test_a_scatter_is_a_kernel_of_its_own_starting_from_a_copy_of_its_base():
    kg = lowered(lambda x, i, s: x.scatter_add(0, i, s.exp()), X, INDEX, SRC)
    (node,) = _scatter_nodes(kg)
    kernel = next(k for k in kg.kernels if node in k.nodes)
    assert kernel.nodes == (node,)
    assert node.ranges == () and node.reduction_ranges == (28,) and node.body.mode == "sum"
    assert node.body.base in {i.name for i in kernel.inputs}  # the copied base is read by the kernel
    text = str(kernel)
    assert "scatter (sum) into a copy of" in text and "scatter_sum(" in text and "exp(" in text
    torch.testing.assert_close(kg(X, INDEX, SRC), X.scatter_add(0, INDEX, SRC.exp()))


def test_lowering_twice_gives_equal_kernels():
    fn = lambda x, i, s: x.scatter_reduce(0, i, s, "amax", include_self=False)  # noqa: E731
    assert lowered(fn, X, INDEX, SRC).key() == lowered(fn, X, INDEX, SRC).key()


def test_a_computed_base_is_not_copied_again():
    kg = lowered(lambda x, i, s: (x * 2).scatter(0, i, s), X, INDEX, SRC)
    assert len(kg.kernels) == 2  # x * 2, then the scatter into a copy of it


def _reduce(mode, include_self):
    return lambda x, i, s: x.scatter_reduce(0, i, s, mode, include_self=include_self)


CASES = {
    "scatter": lambda x, i, s: x.scatter(0, i, s),
    "scatter_value": lambda x, i, s: x.scatter(1, i[:5, :2] % 4, 7.0),
    "scatter_add_dim1": lambda x, i, s: x.scatter_add(1, i[:5] % 4, s),
    "index_put": lambda x, i, s: torch.index_put(x, (i[:, 0] - 5,), s),
    "index_put_accumulate": lambda x, i, s: torch.index_put(x, (i[:, 0],), s, accumulate=True),
    "index_put_two_dims": lambda x, i, s: torch.index_put(x, (i[:, 0], i[:, 1] % 4), s[:, 0], accumulate=True),
    "index_put_0d_values": lambda x, i, s: torch.index_put(x, (i[:, 0],), s[0, 0], accumulate=True),
    "put": lambda x, i, s: x.put(i[:, 0] - 3, s[:, 0], accumulate=True),
    "index_reduce_amin": lambda x, i, s: x.index_reduce(0, i[:, 0], s, "amin", include_self=False),
    "masked_scatter": lambda x, i, s: x.masked_scatter(x > 0, s),
    **{f"scatter_reduce_{m}_{inc}": _reduce(m, inc) for m in ("sum", "prod", "mean", "amax", "amin")
       for inc in (True, False)},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_evaluator_matches_eager(name, dtype):
    fn = CASES[name]
    x, src = (X * 3).to(dtype), (SRC * 3).to(dtype)
    if dtype.is_floating_point:
        x[1, 2] = float("nan")
    torch.testing.assert_close(lowered(fn, x, INDEX, src)(x, INDEX, src), fn(x, INDEX, src), equal_nan=True)


def test_bool_sums_are_ors_and_products_ands():
    x, src = X > 0, SRC > 0
    for mode in ("sum", "prod", "amax", "amin"):
        fn = _reduce(mode, True)
        torch.testing.assert_close(lowered(fn, x, INDEX, src)(x, INDEX, src), fn(x, INDEX, src))


@pytest.mark.parametrize("bad", [5, -1, 100])
def test_out_of_range_and_negative_scatter_indices_raise(bad):
    kg = lowered(lambda x, i, s: x.scatter_add(0, i, s), X, INDEX, SRC)
    wrong = INDEX.clone()
    wrong[2, 3] = bad
    with pytest.raises(IndexError, match="out of bounds for a dimension of size 5"):
        kg(X, wrong, SRC)


def test_empty_source_leaves_the_destination():
    kg = lowered(lambda x, i, s: x.scatter_add(0, i[:0], s) + 1, X, INDEX, SRC)
    assert not _scatter_nodes(kg)
    torch.testing.assert_close(kg(X, INDEX, SRC), X + 1)


def test_masked_scatter_with_too_few_source_elements_raises():
    few = SRC[:1, :2].contiguous()  # fewer elements than X has positives (eager: RuntimeError)
    kg = lowered(lambda x, s: x.masked_scatter(x > 0, s), X, few)
    with pytest.raises(IndexError, match="out of bounds"):
        kg(X, few)


def test_boolean_mask_index_put_is_refused_with_the_node_named():
    with pytest.raises(NotImplementedError, match="index_put"):
        lowered(lambda x, m, v: aten.index_put(x, [m], v), X, X > 0, torch.tensor(1.0))


def test_embedding_bag_aux_outputs_read_are_refused():
    w, i, o = X, torch.tensor([0, 4, 4, 1]), torch.tensor([0, 1, 3])
    fn = lambda w, i, o: aten._embedding_bag_forward_only(w, i, o, False, 1)[2] + 1  # bag_size  # noqa: E731
    with pytest.raises(NotImplementedError, match="offset2bag/bag_size/max_indices"):
        lowered(fn, w, i, o)
    bags = lambda w, i, o: aten._embedding_bag_forward_only(w, i, o, False, 1)[0]  # noqa: E731
    torch.testing.assert_close(lowered(bags, w, i, o)(w, i, o), bags(w, i, o))


def test_low_precision_bags_accumulate_in_float32():
    w, i = (torch.randn(40, 3, generator=_gen(3)) * 100).bfloat16(), torch.arange(40)
    fn = lambda w, i, o: aten._embedding_bag_forward_only(w, i, o, False, 0)[0]  # noqa: E731
    o = torch.tensor([0, 1, 25])
    assert torch.equal(lowered(fn, w, i, o)(w, i, o), fn(w, i, o))


def test_repeat_interleave_of_a_repeats_tensor_is_a_search_in_its_running_total():
    fn = lambda r: torch.repeat_interleave(r, output_size=8)  # noqa: E731
    r = torch.tensor([2, 0, 1, 4, 0, 1])
    kg = lowered(fn, r)
    assert any(isinstance(n.body, Scan) for k in kg.kernels for n in k.nodes)
    torch.testing.assert_close(kg(r), fn(r))
