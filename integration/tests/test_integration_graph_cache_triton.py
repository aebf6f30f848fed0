"""The whole-graph cache with codegen_triton's kernels (``codegen="cuda"``; on CPU tensors under
``TRITON_INTERPRET=1``, as CI runs it): kernels pickle as their generated source, and a cache
moved elsewhere writes that source again. (A fresh process loading inference and training
graphs of either codegen: test_integration_graph_cache.py.)"""

from __future__ import annotations

import importlib.metadata
import os
import pickle
import shutil
import sys

import torch

from kiln.integration import KilnOptions, load_cache, save_cache
from kiln.integration._internal import graph_key
from kiln.integration._internal.graph_cache import cache_root

sys.path.insert(0, os.path.dirname(__file__))
import graph_cache_runs  # noqa: E402

pytestmark = graph_cache_runs.NEEDS_TRITON
CODEGEN = "cuda"  # codegen_triton's plugin name


def _entries(cache_dir) -> list:
    return sorted(cache_root(KilnOptions(cache_dir=cache_dir)).glob("*.pkl"))


def test_a_moved_cache_rewrites_the_triton_source_it_lost(tmp_path):
    """An entry holds its kernels' source: the copy loads after the original directory and the
    generated source files are gone (the source is written again, under the new directory)."""
    first, second, archive = tmp_path / "first", tmp_path / "second", tmp_path / "cache.tar"
    cold = graph_cache_runs.run(str(first), CODEGEN)
    assert save_cache(archive, {"cache_dir": str(first)}) == 1
    shutil.rmtree(first)
    assert load_cache(archive, {"cache_dir": str(second)}) == 1
    for source in (second / "triton").glob("kiln_triton_*"):
        source.unlink()
    warm = graph_cache_runs.run(str(second), CODEGEN)  # in this process: a fresh one is tested above
    assert warm["reports"][0].cached and warm["kernel_calls"] == cold["kernel_calls"] > 0
    assert list((second / "triton").glob("kiln_triton_*.py")) and not first.exists()
    for got, expected in zip(warm["outputs"], cold["outputs"]):
        assert torch.equal(got, expected)


def test_a_triton_kernel_pickles_as_its_source_and_signature(tmp_path):
    """Unpickled in this process, a kernel is rebuilt from the stored source and runs alike; the
    kernels of one graph share one copy of their module's source."""
    from kiln.codegen_triton._internal.runtime import TritonKernel
    from kiln.codegen_triton._internal.serialize import KernelSignature

    modules = []

    def backend(gm, example_inputs):
        modules.append(graph_cache_runs._recording_backend(str(tmp_path), [], CODEGEN)(gm, example_inputs))
        return modules[-1]

    with torch.no_grad():
        torch.compile(lambda t: torch.softmax(t * 2, -1).cos() + t.sum(), backend=backend)(torch.randn(6, 5))
    kernels = [n.target for n in modules[0].graph.nodes if isinstance(n.target, TritonKernel)]
    assert len(kernels) > 1 and not any(k.kernel.symbols for k in kernels)
    raw = pickle.dumps(kernels)
    (source_file,) = (tmp_path / "triton").glob("kiln_triton_*.py")
    assert raw.count(source_file.read_bytes()) == 1
    for kernel, loaded in zip(kernels, pickle.loads(raw)):
        assert isinstance(loaded.kernel, KernelSignature) and loaded.kernel == KernelSignature.of(kernel.kernel)
        assert loaded.jit_function is kernel.jit_function  # the generated module is imported once per process
        inputs = [torch.empty_strided([int(n) for n in spec.size], [int(n) for n in spec.stride], dtype=spec.dtype
                                      ).normal_() for spec in kernel.kernel.inputs]
        for got, expected in zip(loaded(*inputs), kernel(*inputs)):
            assert torch.equal(got, expected)


def test_the_key_names_tritons_version():
    """Triton compiles the stored source: a Triton upgrade must miss."""
    assert f"triton {importlib.metadata.version('triton')} " in graph_key._versions_text(None)


def test_a_dynamic_shape_triton_graph_round_trips_and_runs_other_sizes(tmp_path):
    """Size symbols travel in the kernels' signatures: the loaded module runs sizes it was not
    compiled at."""
    from kiln.integration._internal import graph_cache

    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, graph_cache_runs._recording_backend(str(tmp_path), [], CODEGEN)(gm, example_inputs)))
        return graphs[-1][1]

    def fn(x):
        return torch.softmax(x * 2, -1).sum(0) + x.mean()

    with torch.no_grad():
        torch.compile(fn, backend=backend, dynamic=True)(torch.randn(5, 6))
    ((dynamo_gm, module),) = graphs
    root = cache_root(KilnOptions(cache_dir=tmp_path)).parent
    frozen = graph_cache._loads(graph_cache._dumps(graph_cache.freeze_module(module, dynamo_gm), root), root)
    loaded = graph_cache.thaw_module(frozen, dynamo_gm)
    x = torch.randn(9, 7)
    sizes = [n.name for n in dynamo_gm.graph.nodes if n.op == "placeholder"][:-1]
    assert len(sizes) == 2  # the two size symbols, then x
    (out,) = loaded(9, 7, x)
    torch.testing.assert_close(out, fn(x))
