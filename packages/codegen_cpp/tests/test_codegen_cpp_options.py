"""CppOptions validates every field when it is built (issue 15): a wrong type is a TypeError, a
wrong value a ValueError, and both name the option and what it accepts."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
import torch

from kiln.codegen_cpp import CODEGEN, CppOptions
from kiln.codegen_cpp._internal.options import _TYPES

WRONG = [
    # (option, value, error, what the message must say)
    ("parallel_threshold", "big", TypeError, r"CppOptions\.parallel_threshold must be an int >= 0.*'big' \(str\)"),
    ("parallel_threshold", True, TypeError, r"parallel_threshold must be an int.*True \(bool\)"),
    ("parallel_threshold", 1.5, TypeError, r"parallel_threshold must be an int.*1\.5 \(float\)"),
    ("parallel_threshold", -1, ValueError, r"parallel_threshold must be an int >= 0.*got -1"),
    ("openmp", "no", TypeError, r"CppOptions\.openmp must be a bool, got 'no' \(str\)"),
    ("vectorize", 1, TypeError, r"CppOptions\.vectorize must be a bool, got 1 \(int\)"),
    ("vector_math", None, TypeError, r"vector_math must be a bool, got None"),
    ("check_strides", "yes", TypeError, r"check_strides must be a bool"),
    ("fill_uninitialized", 0, TypeError, r"fill_uninitialized must be a bool"),
    ("flags", ["-O3"], TypeError, r"CppOptions\.flags must be a tuple of strings.*\(list\)"),
    ("flags", ("-O3", 3), TypeError, r"flags must be a tuple of non-empty strings.*got 3"),
    ("flags", ("-O3", " "), TypeError, r"flags must be a tuple of non-empty strings"),
    ("compiler", None, TypeError, r"CppOptions\.compiler must be a str"),
    ("compiler", "", ValueError, r"CppOptions\.compiler must name a C\+\+ compiler"),
    ("cache_dir", 3, TypeError, r"CppOptions\.cache_dir must be a path"),
]


@pytest.mark.parametrize("name, value, error, message", WRONG, ids=[f"{w[0]}={w[1]!r}" for w in WRONG])
def test_a_wrong_option_raises_naming_it_and_what_it_accepts(name, value, error, message):
    with pytest.raises(error, match=message):
        CppOptions(**{name: value})


def test_every_option_is_validated():
    assert set(_TYPES) == {field.name for field in dataclasses.fields(CppOptions)}


def test_valid_options_are_kept_and_normalized(tmp_path):
    numpy = pytest.importorskip("numpy")
    options = CppOptions(cache_dir=str(tmp_path), parallel_threshold=numpy.int64(0), flags=("-O2",),
                         compiler="clang++", openmp=False, vectorize=False)
    assert options.cache_dir == pathlib.Path(tmp_path) and type(options.parallel_threshold) is int
    assert (options.parallel_threshold, options.flags, options.openmp) == (0, ("-O2",), False)


def test_the_plugin_builds_validated_options_from_backend_settings(tmp_path):
    with pytest.raises(TypeError, match=r"CppOptions\.parallel_threshold must be an int.*'big'"):
        CODEGEN.make_options({"parallel_threshold": "big"})
    options = CODEGEN.make_options({"parallel_threshold": 7, "cache_dir": tmp_path, "openmp": False})
    assert (options.parallel_threshold, options.openmp, options.cache_dir) == (7, False, tmp_path / "cpp")


@pytest.mark.parametrize("policy, expected", [(None, "PARALLEL_THRESHOLD"), ("active", "PARALLEL_THRESHOLD"),
                                              ("passive", "PASSIVE_PARALLEL_THRESHOLD"),
                                              (" PASSIVE ", "PASSIVE_PARALLEL_THRESHOLD")])
def test_the_default_parallel_threshold_follows_the_openmp_wait_policy(tmp_path, monkeypatch, policy, expected):
    """Under passive waiting each parallel region wakes sleeping threads (70-100 us measured), so
    loops run on one thread up to a larger size; an explicit threshold always wins."""
    from kiln.codegen_cpp._internal import options as module

    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    assert module.PASSIVE_PARALLEL_THRESHOLD > module.PARALLEL_THRESHOLD
    assert CppOptions(cache_dir=tmp_path).parallel_threshold == getattr(module, expected)
    assert CODEGEN.make_options({"parallel_threshold": None, "cache_dir": tmp_path}).parallel_threshold == \
        getattr(module, expected)
    assert CppOptions(cache_dir=tmp_path, parallel_threshold=5).parallel_threshold == 5


@pytest.mark.parametrize("policy, factor", [("passive", 4), ("active", 2)])
def test_plain_arithmetic_kernels_go_parallel_from_a_larger_size(cpp, monkeypatch, policy, factor):
    """A kernel of loads, compares and selects (a ReLU backward) moves memory more than it
    computes: parallel only from `factor` x parallel_threshold points; one with exp keeps the
    threshold. The same sizes either side of the light threshold check it."""
    monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    builder = cpp.with_options(parallel_threshold=4096)
    x, g = torch.randn(64, 64 * factor), torch.randn(64, 64 * factor)  # 4096 * factor points
    light = builder.check(lambda x, g: torch.where(x <= 0, 0.0, g), x, g).source
    heavy = builder.check(lambda x, g: torch.exp(x) * g, x[:, :64], g[:, :64]).source  # 4096 points
    below = builder.check(lambda x, g: torch.where(x <= 0, 0.0, g), x[:, :-1], g[:, :-1]).source
    assert "omp parallel" in light and "omp parallel" in heavy
    assert "omp parallel" not in below
