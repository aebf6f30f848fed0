"""The on-disk cache (keyed by source, flags and compiler), options and compile errors."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import multiprocessing
import os
import pathlib
import stat
import tempfile

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, loopir
from kiln.codegen_cpp import CppCompileError, CppOptions
from kiln.codegen_cpp._internal.build import build_library
from kiln.loopir.codegen import ArtifactCacheError


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


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage", "no checksum", "grown"])
def test_a_damaged_cached_library_is_rebuilt_not_loaded(tmp_path, damage, caplog):
    # build_library only (nothing loaded here): loading a truncated library would kill the process.
    options = CppOptions(cache_dir=tmp_path)
    source = codegen_cpp.generate(_kernel_graph(lambda x: x.exp() + 1, torch.randn(4, 5)), options)
    library, hit = build_library(source, options)
    good = library.read_bytes()
    assert not hit and build_library(source, options) == (library, True)
    if damage == "no checksum":
        library.with_name("kernels.so.sha256").unlink()
    else:
        library.write_bytes({"truncated": good[: len(good) // 2], "empty": b"", "garbage": b"x" * len(good),
                             "grown": good + b"\0"}[damage])
    with caplog.at_level(logging.WARNING):
        rebuilt, hit = build_library(source, options)
    assert rebuilt == library and not hit and library.read_bytes() == good
    assert "rebuilding it" in caplog.text and str(library) in caplog.text  # said, not silent
    ctypes.CDLL(str(rebuilt))  # what the cache hands back loads


def test_a_damaged_library_is_rebuilt_when_compiled_again(tmp_path):
    """Through `compile`, as a later process would: the truncated library is never handed to
    the loader (where it would kill the process with SIGBUS), the graph still compiles and runs."""
    options = CppOptions(cache_dir=tmp_path)
    x = torch.randn(4, 5)
    kernel_graph = _kernel_graph(lambda x: x.exp() + 1, x)
    # Built (by "another process") but never loaded in this one: dlopen hands back a library
    # already loaded under the same path, so truncating a loaded one tests nothing.
    library, _ = build_library(codegen_cpp.generate(kernel_graph, options), options)
    library.write_bytes(library.read_bytes()[:1000])
    module = codegen_cpp.compile(kernel_graph, options)
    assert not module.meta["kiln_cpp"].cache_hit
    torch.testing.assert_close(module(x), x.exp() + 1)


def test_default_cache_dir_is_per_user(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert CppOptions().cache_dir == tmp_path / "xdg" / "kiln" / "codegen_cpp"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: only absolute paths count
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert CppOptions().cache_dir == tmp_path / "home" / ".cache" / "kiln" / "codegen_cpp"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path / "file" / "home"))  # a home kiln cannot create
    assert CppOptions().cache_dir == pathlib.Path(tempfile.gettempdir()) / f"kiln-cache-{os.getuid()}" / "codegen_cpp"


def test_cache_directories_are_created_private(tmp_path):
    options = CppOptions(cache_dir=tmp_path / "new" / "cache")
    library, _ = build_library("extern \"C\" int kiln_answer() { return 42; }\n", options)
    for directory in (options.cache_dir, library.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_cache_others_can_write_to_is_refused(tmp_path, mode):
    """A library planted in a shared cache (with a matching checksum) is never loaded."""
    options = CppOptions(cache_dir=tmp_path / "cache")
    source = "extern \"C\" int kiln_answer() { return 42; }\n"
    library, _ = build_library(source, options)
    options.cache_dir.chmod(mode)
    with pytest.raises(ArtifactCacheError, match=r"writable by other users.*chmod 700"):
        build_library(source, options)


def test_a_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    options = CppOptions(cache_dir=tmp_path / "cache")
    source = "extern \"C\" int kiln_answer() { return 42; }\n"
    build_library(source, options)
    monkeypatch.setattr(os, "getuid", lambda: options.cache_dir.stat().st_uid + 1)
    with pytest.raises(ArtifactCacheError, match="belongs to user"):
        build_library(source, options)


def _build_and_load(cache_dir, source, barrier, results):
    barrier.wait()  # every process starts building the same key at the same moment
    library, _ = build_library(source, CppOptions(cache_dir=cache_dir))
    results.put(ctypes.CDLL(str(library)).kiln_answer())


def test_processes_building_the_same_key_at_once_are_safe(tmp_path):
    context = multiprocessing.get_context("fork")
    count = 4
    barrier, results = context.Barrier(count), context.Queue()
    source = "extern \"C\" int kiln_answer() { return 42; }\n" + "static int filler[4096] = {1};\n"
    processes = [context.Process(target=_build_and_load, args=(tmp_path, source, barrier, results))
                 for _ in range(count)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0] * count
    assert sorted(results.get(timeout=5) for _ in range(count)) == [42] * count
    library, hit = build_library(source, CppOptions(cache_dir=tmp_path))
    assert hit and ctypes.CDLL(str(library)).kiln_answer() == 42
    assert not list(tmp_path.glob("*/*.tmp*"))  # no temporaries left behind


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
