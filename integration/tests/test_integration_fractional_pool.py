"""Fractional max pooling (issue 20) compiles to kiln kernels with fallback=False on the C++ and
Triton codegens (Triton's interpreter on the CPU): forward with indices, and a training step,
whose backward (kiln's decomposition: a scatter-add of the gradients at the saved indices) is
kernels too. The module's random samples are drawn by eager before the op, so a fixed
`_random_samples` tensor makes eager and kiln pool the same windows."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from kiln.integration import backend, explain

CODEGENS = ("cpu", "cuda")  # "cuda" is the Triton codegen; under TRITON_INTERPRET=1 on the CPU
PIPELINE_LOG = "kiln.integration._internal.pipeline"


def _x(shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _samples(batch, channels, n):
    return torch.rand(batch, channels, n, generator=torch.Generator().manual_seed(7))


def pool2d(x, samples):
    return F.fractional_max_pool2d(x, (3, 2), output_size=(4, 5), return_indices=True, _random_samples=samples)


def pool3d(x, samples):
    return F.fractional_max_pool3d(x, 2, output_size=(3, 4, 3), return_indices=True, _random_samples=samples)


CASES = {"2d": (pool2d, (2, 3, 9, 8), 2), "3d": (pool3d, (1, 2, 6, 7, 5), 3)}


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_fractional_max_pool_compiles_to_kernels(name, codegen):
    fn, shape, n = CASES[name]
    x, samples = _x(shape), _samples(shape[0], shape[1], n)
    report = explain(fn, x, samples, options={"fallback": False, "codegen": codegen})
    assert report.kernel_count >= 1 and not report.fallback_nodes and not report.eager_graphs, str(report)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options={"fallback": False,
                                                                                 "codegen": codegen}))
    (values, indices), (want_values, want_indices) = compiled(x, samples), fn(x, samples)
    torch.testing.assert_close(values, want_values)
    assert torch.equal(indices, want_indices)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_training_step_through_fractional_max_pool(codegen, caplog, backward_counts):
    def loss(x, samples, weight):
        values, _ = pool2d(x * weight, samples)
        return values.square().sum()

    x, samples = _x((2, 3, 9, 8)), _samples(2, 3, 2)
    weight = _x((3, 1, 1), seed=1).requires_grad_()
    twin = weight.detach().clone().requires_grad_()
    compiled = torch.compile(loss, backend=lambda gm, ex: backend(gm, ex, options={"fallback": False,
                                                                                   "codegen": codegen}))
    with caplog.at_level(logging.INFO, logger=PIPELINE_LOG):
        compiled(x, samples, weight).backward()
    loss(x, samples, twin).backward()
    counts = backward_counts(caplog.text)
    assert counts and all(kernels >= 1 and fallbacks == 0 for kernels, fallbacks in counts), caplog.text
    torch.testing.assert_close(weight.grad, twin.grad)
