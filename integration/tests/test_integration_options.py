"""KilnOptions (issue 15): every option's type and range checked when the options are built,
codegen names checked against the registered plugins, each error naming the option and what it
accepts; the codegens' own options (CppOptions, TritonOptions) are checked by their packages."""

from __future__ import annotations

import dataclasses

import pytest

from kiln import loopir
from kiln.integration import KilnOptions, OptionsError
from kiln.integration._internal import codegen_registry
from kiln.integration._internal.options import _TYPES

WRONG = [
    ({"min_region_size": 0}, r"min_region_size must be >= 1, got 0"),
    ({"verify_calls": -1}, r"verify_calls must be >= 0, got -1"),
    ({"parallel_threshold": -5}, r"parallel_threshold must be >= 0, got -5"),
    ({"graph_cache_max_bytes": 1.5}, r"graph_cache_max_bytes must be int, got 1\.5 \(float\)"),
    ({"partitioner": "greedy"}, r"partitioner must be 'min_cut' or 'save_all', got 'greedy'"),
    ({"openmp": 1}, r"openmp must be bool, got 1 \(int\)"),
    ({"cache_dir": 3}, r"cache_dir must be str or PathLike or None, got 3"),
    ({"lowerings": {}}, r"lowerings must be None or a kiln\.loopir\.Lowerings.*got a dict"),
    ({"codegen": "metal"}, r"codegen='metal' names no codegen; registered under 'kiln\.codegen': cpu, cuda, reference"),
    ({"codegen": 3}, r"codegen must be str or None, got 3 \(int\)"),
]


@pytest.mark.parametrize("options, message", WRONG, ids=[str(w[0]) for w in WRONG])
def test_a_bad_value_names_the_option_and_what_is_valid(options, message):
    with pytest.raises(OptionsError, match=message):
        KilnOptions.create(options, environ={})


def test_options_built_directly_or_replaced_are_checked_too():
    with pytest.raises(OptionsError, match="codegen='metal' names no codegen"):
        KilnOptions(codegen="metal")
    with pytest.raises(OptionsError, match="fallback must be bool"):
        dataclasses.replace(KilnOptions(), fallback="no")


def test_every_option_but_the_lowering_table_has_a_type_check():
    assert set(_TYPES) | {"lowerings"} == {field.name for field in dataclasses.fields(KilnOptions)}


def test_a_registered_plugin_name_is_a_valid_codegen(monkeypatch):
    npu = dataclasses.replace(loopir.REFERENCE_CODEGEN, name="npu", devices=("npu",))
    monkeypatch.setattr(codegen_registry, "registered", lambda: {**codegen_registry.BUILTIN, "npu": npu})
    assert KilnOptions.create({"codegen": "npu"}, environ={}).codegen == "npu"
    with pytest.raises(OptionsError, match="registered under 'kiln.codegen': cpu, cuda, npu, reference"):
        KilnOptions.create({"codegen": "tpu"}, environ={})


def test_environment_values_are_checked():
    with pytest.raises(OptionsError, match="KILN_VERIFY_CALLS must be an integer, got 'some'"):
        KilnOptions.create(environ={"KILN_VERIFY_CALLS": "some"})
    assert KilnOptions.create(environ={"KILN_GRAPH_CACHE": "0"}).graph_cache is False


def test_a_lowering_table_is_accepted():
    table = loopir.default_lowerings()
    assert KilnOptions.create({"lowerings": table}, environ={}).lowerings is table
