"""Shared fixtures of the integration tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles afresh: Dynamo's caches (and its recompile counts) start empty."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
