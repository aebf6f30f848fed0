"""Generated source (readability, one @triton.jit per kernel), the cache, options, verify,
the ops-handler completeness and the entry point."""

import builtins
import dataclasses
import importlib.metadata
import pathlib
import tomllib

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln.codegen_triton as codegen_triton
from kiln.codegen_triton import (
    TritonArtifacts,
    TritonCodegenError,
    TritonOptions,
    compile,
    generate,
    verify,
)
from kiln.codegen_triton._internal.handler import TritonHandler
from kiln.loopir import OPS, lower


def three_kernel_graph():
    def fn(x, y):
        a = torch.sigmoid(x) * y  # pointwise over [4, 6]
        return a.sum(-1), a.t() + 1  # a reduction over [4]; a pointwise over [6, 4]

    return fn, lower(make_fx(fn)(torch.randn(4, 6), torch.randn(4, 6)), fuse_rows=False)


def test_one_jit_function_per_kernel_named_after_it():
    _, kernel_graph = three_kernel_graph()
    source = generate(kernel_graph)
    assert source.count("@triton.jit") == len(kernel_graph.kernels) >= 2
    for kernel in kernel_graph.kernels:
        assert f"\ndef {kernel.name}(" in source
        for spec in kernel.inputs:
            assert f"in_{spec.name}" in source
        for node in kernel.nodes:
            assert f"# {node.spec}" in source  # each buffer is announced by a comment
    builtins.compile(source, "<generated>", "exec")  # valid Python: Triton parses it as such


def test_generate_is_deterministic():
    _, first = three_kernel_graph()
    _, second = three_kernel_graph()
    assert generate(first) == generate(second)


def test_second_compile_hits_the_cache(tmp_path):
    fn, kernel_graph = three_kernel_graph()
    options = TritonOptions(cache_dir=tmp_path)
    first = compile(kernel_graph, options)
    second = compile(three_kernel_graph()[1], options)
    a, b = first.meta["kiln_triton"], second.meta["kiln_triton"]
    assert isinstance(a, TritonArtifacts)
    assert (a.cache_hit, b.cache_hit) == (False, True)
    assert a.source_path == b.source_path and a.source_path.parent == tmp_path
    assert a.source_path.read_text() == a.source
    assert a.kernels == tuple(k.name for k in kernel_graph.kernels)
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    for module in (first, second):
        for got, expected in zip(module(x, y), fn(x, y)):
            torch.testing.assert_close(got, expected)


def test_verify_rejects_uncompiled_and_reference_kernels(tmp_path):
    _, kernel_graph = three_kernel_graph()
    with pytest.raises(TritonCodegenError, match="kiln_triton"):
        verify(kernel_graph.gm)
    module = compile(kernel_graph, TritonOptions(cache_dir=tmp_path))
    verify(module)
    node = next(n for n in module.graph.nodes if hasattr(n.target, "kernel"))
    node.target = node.target.kernel  # back to loopir's reference evaluator
    with pytest.raises(TritonCodegenError, match=f"node {node.name}"):
        verify(module)


def test_input_checks_name_the_input(tmp_path):
    _, kernel_graph = three_kernel_graph()
    module = compile(kernel_graph, TritonOptions(cache_dir=tmp_path))
    with pytest.raises(TritonCodegenError, match="x_1 must be a torch.float32"):
        module(torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6))
    with pytest.raises(TritonCodegenError, match="sizes"):
        module(torch.randn(4, 7), torch.randn(4, 7))


def test_options_are_validated():
    with pytest.raises(ValueError, match="xblock"):
        TritonOptions(xblock=100)
    with pytest.raises(ValueError, match="num_warps"):
        TritonOptions(num_warps=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        TritonOptions().xblock = 8


def test_handler_implements_every_op():
    # defined by codegen_triton or by the shared layer it builds on (not OpsHandler's raising default)
    defined = {name for klass in TritonHandler.__mro__
               if klass.__module__.startswith(("kiln.codegen_triton", "kiln.loopir._internal.shared"))
               for name in vars(klass)}
    assert sorted(set(OPS) - defined) == []


def test_public_surface():
    assert sorted(codegen_triton.__all__) == sorted(
        ["compile", "generate", "verify", "TritonOptions", "TritonArtifacts", "TritonCodegenError", "CODEGEN"])


def test_entry_point_names_the_codegen_plugin():
    pyproject = pathlib.Path(__file__).parents[1] / "pyproject.toml"
    entry_points = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["kiln.codegen"]
    module_name, attr = entry_points["cuda"].split(":")
    plugin = getattr(__import__(module_name, fromlist=[attr]), attr)
    assert plugin is codegen_triton.CODEGEN and plugin.compile is compile and plugin.devices == ("cuda",)
    assert plugin.capabilities.row_fusion and plugin.capabilities.bias_epilogues
    assert plugin.make_options({"fill_uninitialized": True, "openmp": False}).fill_uninitialized
    try:
        importlib.metadata.distribution("kiln-codegen-triton")
    except importlib.metadata.PackageNotFoundError:
        return  # run from a source checkout: the pyproject is the only record of the entry point
    (installed,) = [e for e in importlib.metadata.entry_points(group="kiln.codegen") if e.name == "cuda"]
    assert installed.load() is plugin


def test_row_nodes_get_their_own_loop_and_a_barrier_only_when_read_back():
    def fn(x):
        e = torch.exp(x - torch.amax(x, -1, keepdim=True))  # a row node, read by the sum and the div
        return e / e.sum(-1, keepdim=True)  # a row node nothing reads after it

    (kernel,) = lower(make_fx(fn)(torch.randn(4, 6))).kernels
    rows = [n.name for n in kernel.nodes if kernel.is_row(n)]
    assert len(rows) == 2
    source = generate(lower(make_fx(fn)(torch.randn(4, 6))))
    assert source.count("for roffset in range(") == 4  # amax, exp row, sum, div row
    assert source.count("row loop over [6]") == 2
    assert source.count("tl.debug_barrier()") == 1
    assert source.count(f"tl.load(out_{rows[0]} + ") == 2  # the sum and the div read the row back
    stores = [line for line in source.splitlines() if "tl.store(" in line and "rmask" in line]
    assert len(stores) == 2 and all(line.endswith("xmask & rmask)") for line in stores)  # row stores: both masks
    builtins.compile(source, "<generated>", "exec")
