"""TritonOptions validates every field when it is built (issue 15), as CppOptions does: a wrong
type is a TypeError, a wrong value a ValueError, and both name the option and what it accepts."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from kiln.codegen_triton import CODEGEN, TritonOptions
from kiln.codegen_triton._internal.options import _TYPES

WRONG = [
    # (option, value, error, what the message must say)
    ("xblock", "big", TypeError, r"TritonOptions\.xblock must be a positive power of two \(an int\), got 'big' \(str\)"),
    ("xblock", True, TypeError, r"xblock must be a positive power of two.*True \(bool\)"),
    ("rblock", 64.0, TypeError, r"TritonOptions\.rblock must be a positive power of two.*64\.0 \(float\)"),
    ("xblock", 100, ValueError, r"TritonOptions\.xblock must be a positive power of two, got 100"),
    ("tile_block", 0, ValueError, r"tile_block must be a positive power of two, got 0"),
    ("reduction_xblock", -8, ValueError, r"reduction_xblock must be a positive power of two, got -8"),
    ("num_warps", 64, ValueError, r"TritonOptions\.num_warps must be a power of two from 1 to 32, got 64"),
    ("max_reduction_warps", 3, ValueError, r"max_reduction_warps must be a positive power of two, got 3"),
    ("check_inputs", "no", TypeError, r"TritonOptions\.check_inputs must be a bool, got 'no' \(str\)"),
    ("sync_checks", 1, TypeError, r"sync_checks must be a bool, got 1 \(int\)"),
    ("autotune", None, TypeError, r"autotune must be a bool, got None"),
    ("fill_uninitialized", 0, TypeError, r"fill_uninitialized must be a bool"),
    ("device", 0, TypeError, r"TritonOptions\.device must be None or a torch device name.*0 \(int\)"),
    ("device", "gpu", ValueError, r"TritonOptions\.device must be None or a torch device name.*'gpu'"),
    ("cache_dir", 3, TypeError, r"TritonOptions\.cache_dir must be a path"),
    ("compile_threads", "all", TypeError, r"TritonOptions\.compile_threads must be an int >= 0, got 'all'"),
    ("compile_threads", -2, ValueError, r"TritonOptions\.compile_threads must be an int >= 0, got -2"),
]


@pytest.mark.parametrize("name, value, error, message", WRONG, ids=[f"{w[0]}={w[1]!r}" for w in WRONG])
def test_a_wrong_option_raises_naming_it_and_what_it_accepts(name, value, error, message):
    with pytest.raises(error, match=message):
        TritonOptions(**{name: value})


def test_every_option_is_validated():
    assert set(_TYPES) == {field.name for field in dataclasses.fields(TritonOptions)}


def test_valid_options_are_kept_and_normalized(tmp_path):
    numpy = pytest.importorskip("numpy")
    options = TritonOptions(cache_dir=str(tmp_path), xblock=numpy.int64(256), device="cuda:1", sync_checks=True)
    assert options.cache_dir == pathlib.Path(tmp_path) and type(options.xblock) is int
    assert (options.xblock, options.device, options.sync_checks) == (256, "cuda:1", True)


def test_the_plugin_builds_validated_options_from_backend_settings(tmp_path):
    with pytest.raises(TypeError, match=r"TritonOptions\.sync_checks must be a bool.*'yes'"):
        CODEGEN.make_options({"sync_checks": "yes"})
    options = CODEGEN.make_options({"autotune": True, "cache_dir": tmp_path})
    assert (options.autotune, options.cache_dir) == (True, tmp_path / "triton")
