"""Group norm in one kernel (loopir's `row_cuts.py`): its normalization over (N, C, H, W) joins
its statistics' kernel over (N, G) rows of C/G * H * W elements, on the C++ codegen and the
Triton codegen (its interpreter on the CPU), with eager's values and strides; the other norms
keep their kernel counts."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from kiln.integration import backend, explain

CODEGENS = ("cpu", "cuda")  # "cuda" is the Triton codegen; under TRITON_INTERPRET=1 on the CPU
PIPELINE_LOG = "kiln.integration._internal.pipeline"


def _x(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed)  # drawn on the CPU, then to the default device (conftest.py)
    return torch.randn(*shape, generator=gen, device="cpu").to(torch.get_default_device())


def _compiled(fn, codegen):
    return torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options={"fallback": False, "codegen": codegen}))


def group_norm(x, w, b):
    return F.group_norm(x, 4, w, b)


def group_norm_one_group(x, w, b):
    return F.group_norm(x, 1, w, b)


def group_norm_plain(x):
    return F.group_norm(x, 3)


CASES = {
    # name: (fn, inputs, kernels)
    "affine": (group_norm, lambda: (_x(4, 32, 8, 8), _x(32, seed=1), _x(32, seed=2)), 1),
    "affine_odd_sizes": (group_norm, lambda: (_x(3, 12, 5, 7), _x(12, seed=1), _x(12, seed=2)), 1),
    "one_group": (group_norm_one_group, lambda: (_x(2, 6, 9, 3), _x(6, seed=1), _x(6, seed=2)), 1),
    "no_affine": (group_norm_plain, lambda: (_x(2, 6, 5, 5),), 1),
    "3d_input": (group_norm, lambda: (_x(4, 8, 50), _x(8, seed=1), _x(8, seed=2)), 1),
    # Where eager keeps the channels-last layout (its CPU kernel), the normalization is computed
    # in memory order (N, H, W, C), another order than the statistics' rows (N, G) x (C/G, H*W):
    # not a regrouping, two kernels. Eager's CUDA kernel returns a contiguous output: one kernel.
    "channels_last": (group_norm, lambda: (_x(2, 16, 5, 6).to(memory_format=torch.channels_last),
                                           _x(16, seed=1), _x(16, seed=2)), None),
}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_group_norm_matches_eager_in_its_kernel_count(name, codegen):
    fn, inputs, kernels = CASES[name]
    args = inputs()
    want = fn(*args)
    if kernels is None:
        kernels = 1 if want.is_contiguous() else 2
    report = explain(fn, *args, options={"fallback": False, "codegen": codegen})
    assert report.kernel_count == kernels and not report.fallback_nodes, str(report)
    torch._dynamo.reset()
    got = _compiled(fn, codegen)(*args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert got.stride() == want.stride()


@pytest.mark.parametrize("codegen", CODEGENS)
def test_group_norm_training_step(codegen, caplog, backward_counts):
    """Forward: one kernel (the statistics it saves are outputs of it). Backward: two (the
    weight and bias gradients reduce over (N, H, W) per channel, the input gradient over each
    group's rows; was three before the normalization fused)."""
    x, w, b, grad = _x(4, 8, 6, 6), _x(8, seed=1), _x(8, seed=2), _x(4, 8, 6, 6, seed=3)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    twins = [t.clone().requires_grad_() for t in (x, w, b)]
    with caplog.at_level(logging.INFO, logger=PIPELINE_LOG):
        _compiled(group_norm, codegen)(*leaves).backward(grad)
    group_norm(*twins).backward(grad)
    assert backward_counts(caplog.text) == [(2, 0)], caplog.text
    assert "[training: forward shown, backward compiled on first backward]: 1 kernels" in caplog.text, caplog.text
    for got, want in zip(leaves, twins):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-4)


def _batch_norm_eval(x, mean, var, w, b):
    return F.batch_norm(x, mean, var, w, b, training=False)


def _batch_norm_train(x, w, b):
    return F.batch_norm(x, None, None, w, b, training=True)


OTHER_NORMS = {
    # name: (fn, inputs, kernels): as before group norm fused
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (64,), w, b),
                   lambda: (_x(16, 64), _x(64, seed=1), _x(64, seed=2)), 1),
    "layer_norm_2d": (lambda x: F.layer_norm(x, (8, 8)), lambda: (_x(4, 6, 8, 8),), 1),
    "softmax": (lambda x: x.softmax(-1), lambda: (_x(16, 64),), 1),
    "instance_norm": (lambda x: F.instance_norm(x), lambda: (_x(2, 8, 5, 5),), 1),  # was 2: a group per channel
    "batch_norm_eval": (_batch_norm_eval, lambda: (_x(4, 8, 5, 5), _x(8, seed=1), _x(8, seed=2).abs() + 1,
                                                   _x(8, seed=3), _x(8, seed=4)), 1),
    "batch_norm_train": (_batch_norm_train, lambda: (_x(4, 8, 5, 5), _x(8, seed=1), _x(8, seed=2)), 2),
}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(OTHER_NORMS))
def test_other_norms_keep_their_kernel_counts(name, codegen):
    fn, inputs, kernels = OTHER_NORMS[name]
    args = inputs()
    report = explain(fn, *args, options={"fallback": False, "codegen": codegen})
    assert report.kernel_count == kernels and not report.fallback_nodes, str(report)
    torch._dynamo.reset()
    torch.testing.assert_close(_compiled(fn, codegen)(*args), fn(*args), rtol=1e-4, atol=1e-4)
