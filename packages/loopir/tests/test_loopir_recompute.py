"""`LowerOptions.recompute_cheap`: cheap values read by several users are computed again by each
user instead of stored once; anything costlier, random or indirect is still a buffer."""

from __future__ import annotations

import math

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, verify


def _lowered(fn, *args, recompute_cheap: bool):
    kg = lower(make_fx(fn)(*args), recompute_cheap=recompute_cheap, row_temporaries=True)
    verify(kg)
    torch.testing.assert_close(kg(*args), fn(*args), atol=1e-2, rtol=1e-2)
    return kg


def _buffers(kg) -> dict[str, torch.dtype]:
    return {n.name: n.spec.dtype for k in kg.kernels for n in k.nodes}


def _log_softmax_of_upcast(logits, bias):
    y = (logits + bias).float()  # read by the max, the sum and the output loops
    z = y - y.amax(-1, keepdim=True)
    return z - z.exp().sum(-1, keepdim=True).log()


def test_an_upcast_read_by_a_log_softmax_is_recomputed_not_stored():
    args = (torch.randn(6, 300, dtype=torch.bfloat16), torch.randn(300, dtype=torch.bfloat16))
    stored = _lowered(_log_softmax_of_upcast, *args, recompute_cheap=False)
    recomputed = _lowered(_log_softmax_of_upcast, *args, recompute_cheap=True)
    # the float32 copy of the logits and the shifted logits (nodes over [6, 300]) are gone:
    # only the output is computed over whole rows
    assert sum(n.spec.size == (6, 300) for k in stored.kernels for n in k.nodes) == 3
    assert sum(n.spec.size == (6, 300) for k in recomputed.kernels for n in k.nodes) == 1


def test_costly_random_and_indirect_values_are_still_stored():
    def costly(x):
        y = torch.tanh(torch.sin(torch.exp(x) * 2 + 1) * x - 3).cos().sigmoid()  # 9 ops
        return y.sum(-1), y * 2

    def indirect(x, i):
        y = x[i]
        return y.sum(-1), y + 1

    x = torch.randn(5, 7)
    for fn, args in [(costly, (x,)), (indirect, (x, torch.tensor([0, 3, 3, 1])))]:
        kg_off = _lowered(fn, *args, recompute_cheap=False)
        kg_on = _lowered(fn, *args, recompute_cheap=True)
        assert len(_buffers(kg_on)) == len(_buffers(kg_off)), fn.__name__

    def random_mask(x):
        keep = torch.rand_like(x) > 0.5
        return x * keep, keep.sum()

    kg = lower(make_fx(random_mask)(x), recompute_cheap=True)
    # the mask two users read is one buffer: both see the same draw
    assert any(n.spec.dtype == torch.bool and n.spec.size == (5, 7) for k in kg.kernels for n in k.nodes)


def test_cheap_values_are_stored_by_default():
    def f(x):
        y = x * 2 + 1
        return y.sum(-1), y.amax(-1)

    x = torch.randn(4, 9)
    stored = _buffers(_lowered(f, x, recompute_cheap=False))
    assert len(_buffers(_lowered(f, x, recompute_cheap=True))) < len(stored)
    assert _buffers(lower(make_fx(f)(x), row_temporaries=True)) == stored  # the default stores


def test_a_cheap_value_read_by_several_externs_is_stored_once():
    def qkv(x, weight, wq, wk, wv):  # one rmsnorm-like value, three matmuls (q/k/v projections)
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
        return h @ wq, h @ wk, h @ wv

    args = (torch.randn(8, 16), torch.randn(16), torch.randn(16, 4), torch.randn(16, 4), torch.randn(16, 4))
    kg = _lowered(qkv, *args, recompute_cheap=True)
    assert len(kg.externs) == 3
    # the normalized value: one buffer over [8, 16] that the three matmuls read, not one per matmul
    assert sum(n.spec.size == (8, 16) for k in kg.kernels for n in k.nodes) == 1


def _op_count(kg, op: str) -> int:
    """How many times `op` appears in the loop bodies of `kg`'s kernels (each body runs once
    per element of its buffer: a value recomputed by two loops counts twice)."""
    return sum(instr.op == op for k in kg.kernels for n in k.nodes for instr in n.body.loop_body.instrs)


def _softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()  # read by the sum and by the output
    return e / e.sum(-1, keepdim=True)


def _batch_norm_train_relu(x, weight, bias):
    mean = x.mean((0, 2, 3), keepdim=True)
    centred = x - mean  # read by the variance and by the output
    var = (centred * centred).mean((0, 2, 3), keepdim=True)
    return torch.relu(centred * torch.rsqrt(var + 1e-5) * weight + bias)


def _lowered_with(fn, *args, transcendental: bool):
    kg = lower(make_fx(fn)(*args), recompute_cheap=True, recompute_transcendental=transcendental,
               row_temporaries=True)
    verify(kg)
    torch.testing.assert_close(kg(*args), fn(*args), atol=1e-5, rtol=1e-5)
    return kg


def test_arithmetic_only_recompute_keeps_a_softmax_exp_computed_once():
    """codegen_cpp's policy (`recompute_transcendental=False`): exp is stored by one loop and
    loaded by the other; with transcendental recompute (codegen_triton's) both loops compute it."""
    x = torch.randn(6, 40)
    assert _op_count(_lowered(_softmax, x, recompute_cheap=False), "exp") == 1
    assert _op_count(_lowered_with(_softmax, x, transcendental=False), "exp") == 1
    assert _op_count(_lowered_with(_softmax, x, transcendental=True), "exp") == 2


def test_arithmetic_only_recompute_still_recomputes_a_batch_norm_centred_input():
    x = torch.randn(4, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    args = (x, torch.randn(1, 3, 1, 1), torch.randn(1, 3, 1, 1))

    def full_size_buffers(kg) -> int:  # channels-last values are stored in memory order: [4, 5, 5, 3]
        return sum(math.prod(int(s) for s in n.spec.size) == x.numel() for k in kg.kernels for n in k.nodes)

    stored = _lowered(_batch_norm_train_relu, *args, recompute_cheap=False)
    arithmetic = _lowered_with(_batch_norm_train_relu, *args, transcendental=False)
    assert full_size_buffers(stored) == 2  # x - mean, and the output
    assert full_size_buffers(arithmetic) == 1  # the output only: x - mean is recomputed
    # the centred value's subtraction runs in the variance's loop too, not only in its own
    assert _op_count(arithmetic, "sub") > _op_count(stored, "sub")


def test_a_gradient_read_by_two_matmuls_one_through_a_transpose_is_stored_once():
    """An MLP backward's output gradient: cheap (two loads, three ops), read by the input-gradient
    matmul, transposed by the weight-gradient matmul and summed for the bias. Recomputed per
    user, the transposed matmul input was a second, transposed copy; stored once, that matmul
    reads a transposed view of the one buffer (as eager and Inductor pass it)."""
    def linear_backward(pred, target, scale, weight, x):
        grad = (pred - target) * (2.0 / pred.numel()) * scale
        return grad @ weight, grad.t() @ x, grad.sum(0)

    args = (torch.randn(16, 8), torch.randn(16, 8), torch.tensor(1.5), torch.randn(8, 12), torch.randn(16, 12))
    kg = _lowered(linear_backward, *args, recompute_cheap=True)
    assert len(kg.externs) == 2
    # one buffer over the gradient's elements (in either orientation), not one per matmul
    assert sum(sorted(n.spec.size) == [8, 16] for k in kg.kernels for n in k.nodes) == 1


def _one_hot_backward(labels, scale, log_probs):
    """nll_loss's backward one-hot `where(i1 == label[i0], -scale, 0)` (every load the same
    along a row), read by log_softmax's backward twice: its sum, and the gradient."""
    ignore = labels != -100
    hot = torch.arange(0, log_probs.shape[1], 1) == torch.where(ignore, labels, 0)[:, None]
    one_hot = torch.where(hot, torch.where(ignore, -scale, 0.0)[:, None], 0.0)
    return one_hot - log_probs.exp() * one_hot.sum(1, keepdim=True)


def test_a_broadcast_of_per_row_values_is_recomputed_on_a_memory_bound_target():
    """Stored, the one-hot costs a write and a read of every element (a language model's logits:
    tokens x vocabulary); its loads are per-row values, so recomputing it is arithmetic only. A
    body as long, with a load along the row, is still stored; so is the one-hot where only
    arithmetic is recomputed (codegen_cpp's policy keeps its row temporaries)."""
    args = (torch.tensor([3, -100, 70, 0, 99, 5]), torch.tensor(0.25), torch.randn(6, 100).log_softmax(1))
    full = [(6, 100)]

    def full_size(kg) -> int:
        return sum([tuple(n.spec.size)] == full for k in kg.kernels for n in k.nodes)

    assert full_size(_lowered_with(_one_hot_backward, *args, transcendental=False)) == 2
    assert full_size(_lowered_with(_one_hot_backward, *args, transcendental=True)) == 1

    def along_rows(labels, scale, log_probs):  # the same body reading a value along the row
        ignore = labels != -100
        hot = log_probs.exp() > 0.5 * torch.where(ignore, labels, 0)[:, None]
        one_hot = torch.where(hot, torch.where(ignore, -scale, 0.0)[:, None], 0.0)
        return one_hot - log_probs * one_hot.sum(1, keepdim=True)

    assert full_size(_lowered_with(along_rows, *args, transcendental=True)) == 2
    narrow = (args[0], args[1], torch.randn(6, 16).log_softmax(1))  # rows shorter than BROADCAST_MIN_WIDTH
    full = [(6, 16)]
    assert full_size(_lowered_with(_one_hot_backward, *narrow, transcendental=True)) == 2
