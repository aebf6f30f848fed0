"""Shared fixtures of the integration tests.

``KILN_INTEGRATION_TEST_DEVICE=cuda`` makes CUDA torch's default device, so the tensors a test
makes live on the GPU; run it with ``-k cuda`` to pick the cases compiled by the Triton codegen
(e.g. the scatter tests on a GPU machine, where the atomics are compiled for real).
"""

import os
import re

import pytest
import torch

DEVICE = os.environ.get("KILN_INTEGRATION_TEST_DEVICE")


def pytest_configure(config):
    if DEVICE:
        torch.set_default_device(DEVICE)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles afresh: Dynamo's caches (and its recompile counts) start empty."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


_BACKWARD = re.compile(r"\[training: backward\]: (\d+) kernels, \d+ extern calls, \d+ ATen nodes lowered, "
                       r"(\d+) fell back to eager")


@pytest.fixture
def backward_counts():
    """(kernels, eager fallbacks) of each training backward graph in the pipeline's log text
    (the `kiln.integration` INFO lines a `caplog` captured)."""
    return lambda text: [tuple(map(int, m.groups())) for m in _BACKWARD.finditer(text)]


# The whole-graph cache stays off in the tests (tests plant bugs in stages, which a graph cached
# by an earlier test would hide); the graph cache's own tests turn it on in their options.
os.environ.setdefault("KILN_GRAPH_CACHE", "0")
