"""The on-disk cache (keyed by source, flags and compiler), options and compile errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, loopir
from kiln.codegen_cpp import CppCompileError, CppOptions
from kiln.codegen_cpp._internal.build import build_library


def _kernel_graph(fn, *args):
    return loopir.lower(make_fx(fn)(*args))


def test_second_compile_is_a_cache_hit(tmp_path):
    options = CppOptions(cache_dir=tmp_path)
    x = torch.randn(4, 5)
    first = codegen_cpp.compile(_kernel_graph(lambda x: x.exp() + 1, x), options)
    second = codegen_cpp.compile(_kernel_graph(lambda x: x.exp() + 1, x), options)
    a, b = first.meta["kiln_cpp"], second.meta["kiln_cpp"]
    assert not a.cache_hit and b.cache_hit
    assert a.source == b.source and a.library_path == b.library_path
    assert a.source_path.read_text() == a.source  # the generated source is a real file
    assert a.library_path.is_file() and a.library_path.parent.parent == tmp_path
    assert sorted(p.name for p in a.library_path.parent.iterdir()) == [
        "kernels.cpp", "kernels.cpp.sha256", "kernels.so", "kernels.so.sha256"]  # checksums: verified loads
    torch.testing.assert_close(second(x), x.exp() + 1)


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "no checksum"])
def test_a_damaged_cached_library_is_rebuilt_not_loaded(tmp_path, damage):
    # build_library only (nothing loaded here): loading a truncated library would kill the process.
    options = CppOptions(cache_dir=tmp_path)
    source = codegen_cpp.generate(_kernel_graph(lambda x: x.exp() + 1, torch.randn(4, 5)), options)
    library, hit = build_library(source, options)
    good = library.read_bytes()
    assert not hit and build_library(source, options) == (library, True)
    if damage == "no checksum":
        library.with_name("kernels.so.sha256").unlink()
    else:
        library.write_bytes({"truncated": good[: len(good) // 2], "empty": b"", "garbage": b"x" * len(good)}[damage])
    rebuilt, hit = build_library(source, options)
    assert rebuilt == library and not hit and library.read_bytes() == good


def test_different_graph_or_flags_get_different_files(tmp_path):
    options = CppOptions(cache_dir=tmp_path)
    x = torch.randn(4, 5)
    plus = codegen_cpp.compile(_kernel_graph(lambda x: x + 1, x), options).meta["kiln_cpp"]
    times = codegen_cpp.compile(_kernel_graph(lambda x: x * 2, x), options).meta["kiln_cpp"]
    other_flags = dataclasses.replace(options, flags=("-O2", "-std=c++17"))
    plus_o2 = codegen_cpp.compile(_kernel_graph(lambda x: x + 1, x), other_flags).meta["kiln_cpp"]
    assert not times.cache_hit and not plus_o2.cache_hit
    dirs = {plus.library_path.parent, times.library_path.parent, plus_o2.library_path.parent}
    assert len(dirs) == 3
    assert set(tmp_path.iterdir()) == dirs


def test_generate_is_deterministic_and_needs_no_compiler(tmp_path):
    kg = _kernel_graph(lambda x: (x.sum(1), x.relu()), torch.randn(3, 4))
    broken = CppOptions(cache_dir=tmp_path, compiler="no-such-compiler")
    assert codegen_cpp.generate(kg) == codegen_cpp.generate(kg, broken)
    assert not list(tmp_path.iterdir())


def test_missing_compiler_raises_clear_error(tmp_path):
    kg = _kernel_graph(lambda x: x + 1, torch.randn(3))
    with pytest.raises(CppCompileError, match=r"'no-such-compiler-kiln' is not usable.*CppOptions\(compiler"):
        codegen_cpp.compile(kg, CppOptions(cache_dir=tmp_path, compiler="no-such-compiler-kiln"))
    with pytest.raises(CppCompileError, match=r"'false' is not usable"):
        codegen_cpp.compile(kg, CppOptions(cache_dir=tmp_path, compiler="false"))


def test_compiler_rejecting_a_flag_raises_with_its_output(tmp_path):
    kg = _kernel_graph(lambda x: x + 1, torch.randn(3))
    options = CppOptions(cache_dir=tmp_path, flags=("-O2", "--no-such-flag-kiln"))
    with pytest.raises(CppCompileError, match=r"(?s)exit status.*--no-such-flag-kiln.*kernels\.cpp"):
        codegen_cpp.compile(kg, options)
    # Nothing half-built is left for the next call to mistake for a cache hit.
    assert not list(tmp_path.glob("*/*.so"))
    codegen_cpp.compile(kg, dataclasses.replace(options, flags=("-O2",)))  # the same graph builds fine


def test_compiler_that_writes_nothing_raises(tmp_path):
    kg = _kernel_graph(lambda x: x + 1, torch.randn(3))
    with pytest.raises(CppCompileError, match="no library written"):
        codegen_cpp.compile(kg, CppOptions(cache_dir=tmp_path, compiler="true"))


def test_options_are_validated():
    with pytest.raises(ValueError, match="parallel_threshold"):
        CppOptions(parallel_threshold=-1)
    with pytest.raises(TypeError, match="tuple"):
        CppOptions(flags=["-O3"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        CppOptions().openmp = False  # type: ignore[misc]
