"""Compiled kernels pickle: unpickling re-opens their shared library only after checking it."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, loopir
from kiln.codegen_cpp import CppOptions
from kiln.codegen_cpp._internal import runtime


def _compiled_kernels(tmp_path, fn, *args):
    module = codegen_cpp.compile(loopir.lower(make_fx(fn)(*args)), CppOptions(cache_dir=tmp_path))
    return [n.target for n in module.graph.nodes if isinstance(n.target, runtime.CompiledKernel)]


def test_a_pickled_kernel_runs_the_same_library(tmp_path, monkeypatch):
    x = torch.randn(6, 5)
    (kernel,) = _compiled_kernels(tmp_path, lambda x: x.sin() * 2 + x, x)
    monkeypatch.setattr(runtime, "_opened", {})  # as in a fresh process
    loaded = pickle.loads(pickle.dumps(kernel))
    assert isinstance(loaded.kernel, runtime.KernelSignature) and loaded.__name__ == kernel.__name__
    assert loaded.kernel == runtime.KernelSignature.of(kernel.kernel)
    torch.testing.assert_close(loaded(x)[0], x.sin() * 2 + x)
    with pytest.raises(ValueError, match="sizes"):  # the input checks come along
        loaded(torch.randn(6, 4))


def test_a_pickled_kernel_whose_library_is_damaged_is_not_loaded(tmp_path, monkeypatch):
    x = torch.randn(4, 3)
    (kernel,) = _compiled_kernels(tmp_path, lambda x: x.exp() + 1, x)
    state = pickle.dumps(kernel)
    library = next(tmp_path.glob("*/kernels.so"))
    replacement = library.with_name("replacement")
    replacement.write_bytes(library.read_bytes()[:100])
    os.replace(replacement, library)  # a new file: the library this process has open stays intact
    monkeypatch.setattr(runtime, "_opened", {})
    with pytest.raises(runtime.LibraryUnavailable, match="does not match"):
        pickle.loads(state)
    library.unlink()
    with pytest.raises(runtime.LibraryUnavailable, match="missing"):
        pickle.loads(state)
