"""Where codegen_triton's tests run their kernels.

By default (CI, no GPU): Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``, set here,
before any test module imports triton). With ``KILN_TRITON_TEST_DEVICE=cuda`` the same tests
compile real kernels for the GPU: the interpreter stays off and torch's default device is
CUDA, so every tensor a test makes (inputs and eager references alike) lives on the GPU.
"""

import os

import pytest

ON_GPU = os.environ.get("KILN_TRITON_TEST_DEVICE", "").startswith("cuda")
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_configure(config):
    if ON_GPU:
        import torch

        torch.set_default_device(os.environ["KILN_TRITON_TEST_DEVICE"])


def pytest_report_header(config):
    where = os.environ["KILN_TRITON_TEST_DEVICE"] if ON_GPU else "Triton interpreter on CPU"
    return f"codegen_triton kernels run on: {where}"


@pytest.fixture(autouse=True)
def seeded():
    """Every test draws its random inputs from the same seed."""
    import torch  # here, not at the top: TRITON_INTERPRET must be set before anything imports triton

    torch.manual_seed(0)
