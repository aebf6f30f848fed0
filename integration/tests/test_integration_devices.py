"""Graphs whose inputs live on a GPU and the CPU (a CPU scalar in a GPU graph, as compiled
autograd passes): kernels for the GPU's nodes, eager ATen for the nodes touching CPU tensors."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend, explain
from kiln.integration._internal.codegens import device_type


def test_the_accelerator_decides_the_device_type():
    cpu_scalar = torch.tensor(1.0, device="cpu")
    assert device_type([torch.empty(2, device="meta"), cpu_scalar, 3]) == "meta"
    assert device_type([cpu_scalar]) == "cpu"
    assert device_type([]) == "cpu"
    assert device_type([3], [torch.empty(2, device="meta"), None]) == "meta"  # a graph of factories


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cpu_scalar_in_a_gpu_graph_stays_eager_and_the_rest_compiles():
    def fn(x, scale):
        return ((x.sin() + 1) * scale).cos().sum(-1)

    x, scale = torch.randn(64, 128, device="cuda"), torch.tensor(3.0)
    report = explain(fn, x, scale)
    assert report.kernel_count >= 1, str(report)
    assert all("device" in f.reason for f in report.fallback_nodes), str(report)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(fn, backend=backend)(x, scale), fn(x, scale))
