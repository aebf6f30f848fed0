import inspect

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every case starts and ends with a clean Dynamo cache."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _line_of(fn, snippet):
    lines, start = inspect.getsourcelines(fn)
    for offset, line in enumerate(lines):
        if snippet in line:
            return start + offset
    raise AssertionError(f"{snippet!r} not in the source of {fn.__name__}")


@pytest.fixture
def line_of():
    """``line_of(fn, snippet)``: absolute line of the first source line of fn containing it."""
    return _line_of
