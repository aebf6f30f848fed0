"""Shared fixtures for codegen_cpp tests: trace with make_fx, lower with loopir, compile to C++
into a per-test cache directory, and compare with eager."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, loopir
from kiln.codegen_cpp import CppOptions


def trace(fn: Callable[..., Any], *args: Any, tracing_mode: str = "real",
          retarget: Mapping[Any, Any] | None = None) -> fx.GraphModule:
    """make_fx, then calls of an op in `retarget` call its value instead: how a test reaches an
    overload make_fx never records (aten.reshape decomposes to view while tracing)."""
    gm = make_fx(fn, tracing_mode=tracing_mode)(*args)
    if retarget:
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target in retarget:
                node.target = retarget[node.target]
        gm.recompile()
    return gm


def assert_same(actual: Any, expected: Any, **tolerances: Any) -> None:
    """Values, dtypes and shapes equal (close for floats); NaNs in the same places."""
    torch.testing.assert_close(actual, expected, equal_nan=True, **tolerances)


@dataclasses.dataclass
class Compiled:
    """What `Builder.build` returns: the kernel graph, the compiled module and its artifacts."""

    kernel_graph: loopir.KernelGraph
    module: fx.GraphModule

    @property
    def artifacts(self) -> codegen_cpp.CppArtifacts:
        return self.module.meta["kiln_cpp"]

    @property
    def source(self) -> str:
        return self.artifacts.source


class Builder:
    """Compiles functions with the options of one test (its own cache directory).

    Test modules reach the helpers through the fixtures (`cpp.assert_same`, `cpp.called_ops`):
    with --import-mode=importlib a conftest is not importable by name.
    """

    def __init__(self, options: CppOptions) -> None:
        self.options = options

    def with_options(self, **changes: Any) -> Builder:
        return Builder(dataclasses.replace(self.options, **changes))

    def build(self, fn: Callable[..., Any], *args: Any, tracing_mode: str = "real",
              retarget: Mapping[Any, Any] | None = None, row_temporaries: bool = False,
              recompute_cheap: bool = False) -> Compiled:
        kg = loopir.lower(trace(fn, *args, tracing_mode=tracing_mode, retarget=retarget),
                          row_temporaries=row_temporaries, recompute_cheap=recompute_cheap)
        module = codegen_cpp.compile(kg, self.options)
        codegen_cpp.verify(module)
        return Compiled(kg, module)

    def check(self, fn: Callable[..., Any], *args: Any, tracing_mode: str = "real",
              retarget: Mapping[Any, Any] | None = None, calls: Sequence[tuple[Any, ...]] | None = None,
              row_temporaries: bool = False, recompute_cheap: bool = False, **tolerances: Any) -> Compiled:
        """Compile `fn` traced on `args`; compare with eager on `args` and on each of `calls`."""
        compiled = self.build(fn, *args, tracing_mode=tracing_mode, retarget=retarget,
                              row_temporaries=row_temporaries, recompute_cheap=recompute_cheap)
        for call_args in [args, *(calls or [])]:
            assert_same(compiled.module(*call_args), fn(*call_args), **tolerances)
        return compiled

    @staticmethod
    def assert_same(actual: Any, expected: Any, **tolerances: Any) -> None:
        assert_same(actual, expected, **tolerances)

    @staticmethod
    def called_ops(fn: Callable[..., Any], *args: Any, tracing_mode: str = "real",
                   retarget: Mapping[Any, Any] | None = None) -> set[Any]:
        """The ATen overloads a function traces to (nothing is compiled)."""
        gm = trace(fn, *args, tracing_mode=tracing_mode, retarget=retarget)
        return {n.target for n in gm.graph.nodes if n.op == "call_function"}


@pytest.fixture
def cpp(tmp_path: pathlib.Path) -> Builder:
    """Default options (OpenMP on, parallel only above the default threshold)."""
    return Builder(CppOptions(cache_dir=tmp_path / "cache"))


@pytest.fixture
def cpp_parallel(tmp_path: pathlib.Path) -> Builder:
    """parallel_threshold=0: every OpenMP parallel path runs, even on tiny sizes."""
    return Builder(CppOptions(cache_dir=tmp_path / "cache", parallel_threshold=0))


@pytest.fixture
def threads():
    """Four threads for the test (more than the rows of the scan tests, so the chunked scan is
    chosen; the parallel scatters share their columns among them), restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    yield 4
    torch.set_num_threads(before)
