"""The whole-graph compiled-artifact cache: a fresh process loads, a damaged entry is rebuilt,
the key changes with what the code depends on, LRU eviction, the CLI, and compile progress."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

from kiln.integration import KilnOptions, explain, load_cache, save_cache
from kiln.integration.__main__ import main as cli
from kiln.integration._internal import codegens, progress
from kiln.integration._internal.graph_cache import GraphCache, cache_root
from kiln.integration._internal.graph_key import graph_key

sys.path.insert(0, os.path.dirname(__file__))
import graph_cache_runs  # noqa: E402


def _entries(cache_dir) -> list:
    return sorted((cache_root(KilnOptions(cache_dir=cache_dir))).glob("*.pkl"))


CODEGENS = [pytest.param("cpu", marks=pytest.mark.skipif(graph_cache_runs.ON_GPU, reason="codegen_cpp compiles "
                                                         "CPU graphs")),
            pytest.param("cuda", marks=graph_cache_runs.NEEDS_TRITON)]


def _nothing_compiled(warm: dict, stages) -> bool:
    """The warm process traced, lowered and generated nothing: no such stage ran and the compile
    pipeline (imported on a miss only) was never imported."""
    return not warm["imported"][graph_cache_runs.PIPELINE] and not any(
        s.endswith(("decomp", "autograd_trace", "lower")) or "codegen" in s for s in stages)


def _imported_codegens(warm: dict) -> list[str]:
    """The codegen packages the warm process imported: only the one it runs kernels of."""
    return [codegen for codegen, (package, _) in graph_cache_runs.CODEGEN_PACKAGES.items() if warm["imported"][package]]


@pytest.mark.parametrize("codegen", CODEGENS)
def test_a_fresh_process_loads_the_compiled_graph(tmp_path, codegen):
    cold = graph_cache_runs.run(str(tmp_path), codegen)
    assert [(r.cached, r.kernels > 0) for r in cold["reports"]] == [(False, True)]
    assert cold["kernel_calls"] > 0 and len(_entries(tmp_path)) == 1
    warm = _in_a_fresh_process(tmp_path, codegen)
    ((cached, kernels, _, stages),) = warm["reports"]
    assert cached and kernels == cold["reports"][0].kernels and _nothing_compiled(warm, stages)
    assert _imported_codegens(warm) == [codegen]
    if codegen == "cpu":  # codegen_triton's package imports its source generator (and loopir's lowering) eagerly
        assert _imported_never_on_a_hit(warm, graph_cache_runs.TRACING) == []
        assert len(warm["kiln_modules"]) <= graph_cache_runs.MAX_KILN_MODULES_ON_A_HIT, warm["kiln_modules"]
    assert warm["kernel_calls"] == cold["kernel_calls"]  # generated kernels run (fallback=False)
    for got, expected in zip(warm["outputs"], graph_cache_runs.workload(*graph_cache_runs.inputs())):
        torch.testing.assert_close(got, expected)
    for got, first in zip(warm["outputs"], cold["outputs"]):
        assert torch.equal(got, first)


def _imported_never_on_a_hit(warm: dict, also: tuple[str, ...] = ()) -> list[str]:
    """The modules the warm process imported that trace, decompose, partition, lower or generate
    code (graph_cache_runs.NEVER_ON_A_HIT), or start with a prefix of `also`."""
    return graph_cache_runs.imported_among(warm["kiln_modules"], graph_cache_runs.NEVER_ON_A_HIT + also)


def _in_a_fresh_process(cache_dir, *mode: str) -> dict:
    out = cache_dir / "warm.pt"
    script = os.path.join(os.path.dirname(__file__), "graph_cache_runs.py")
    done = subprocess.run([sys.executable, script, str(cache_dir), str(out), *mode], capture_output=True, text=True,
                          env=dict(os.environ, KILN_GRAPH_CACHE="0"))  # the option, not the environment, decides
    assert done.returncode == 0, done.stderr[-3000:]
    return {**torch.load(out, weights_only=False), "stderr": done.stderr}


@pytest.fixture(scope="module", params=CODEGENS)
def training_runs(request, tmp_path_factory) -> tuple[str, dict, dict]:
    """(codegen, cold, warm): a training step compiled cold, then one in a fresh process on its cache."""
    cache_dir = tmp_path_factory.mktemp(f"training-{request.param}")
    cold = graph_cache_runs.run_training(str(cache_dir), request.param)
    assert [(r.cached, r.backward) for r in cold["reports"]] == [(False, False), (False, True)]
    assert all(r.kernels > 0 for r in cold["reports"]) and len(_entries(cache_dir)) == 1
    return request.param, cold, _in_a_fresh_process(cache_dir, "training", request.param)


def test_a_training_graph_is_loaded_by_a_fresh_process(training_runs):
    """Forward and backward come from the cache: nothing traced, the gradients are eager's."""
    codegen, cold, warm = training_runs
    assert [report[:3] for report in warm["reports"]] == [(True, r.kernels, r.backward) for r in cold["reports"]]
    assert _nothing_compiled(warm, warm["reports"][0][3]) and _imported_codegens(warm) == [codegen]
    if codegen == "cpu":
        assert _imported_never_on_a_hit(warm) == []
    assert "Warning" not in warm["stderr"], warm["stderr"]  # e.g. torch 2.13's on unpickling a LeafSpec
    assert warm["kernel_runs"] == cold["kernel_runs"] > 0  # generated kernels run (fallback=False)
    eager = graph_cache_runs.eager_training()
    torch.testing.assert_close(warm["loss"], eager["loss"])
    torch.testing.assert_close(warm["grads"], eager["grads"])
    for got, first in zip(warm["grads"], cold["grads"]):
        assert torch.equal(got, first)


@pytest.mark.xfail(strict=True, reason="autograd_trace's runtime module (AotCompiled.from_plan) imports the joint "
                   "trace and the partitioner: its run-time half is not yet a module of its own")
def test_a_training_hit_imports_no_tracing(training_runs):
    assert graph_cache_runs.imported_among(training_runs[2]["kiln_modules"], graph_cache_runs.TRACING) == []


def test_a_saved_cache_loads_under_another_directory_in_a_fresh_process(tmp_path):
    """save_cache/load_cache ship a warm cache: entries name their kernel libraries relative to
    the cache directory, so the copy works after the original is gone."""
    first, second, archive = tmp_path / "first", tmp_path / "second", tmp_path / "cache.tar"
    cold = graph_cache_runs.run(str(first))
    assert save_cache(archive, {"cache_dir": str(first)}) == 1
    shutil.rmtree(first)
    assert load_cache(archive, {"cache_dir": str(second)}) == 1
    assert load_cache(archive, {"cache_dir": str(second)}) == 0  # already there: kept
    warm = _in_a_fresh_process(second)
    assert warm["reports"][0][0] and warm["kernel_calls"] == cold["kernel_calls"] > 0
    for got, expected in zip(warm["outputs"], cold["outputs"]):
        assert torch.equal(got, expected)


def test_the_cli_saves_and_loads_a_cache(tmp_path, capsys):
    graph_cache_runs.run(str(tmp_path / "first"))
    archive = str(tmp_path / "cache.tar")
    assert cli(["cache", "save", archive, "--cache-dir", str(tmp_path / "first")]) == 0
    assert cli(["cache", "load", archive, "--cache-dir", str(tmp_path / "second")]) == 0
    assert "loaded 1 new entries" in capsys.readouterr().out and len(_entries(tmp_path / "second")) == 1


def test_an_archive_with_paths_outside_the_cache_is_refused(tmp_path):
    outside = tmp_path / "evil.txt"
    outside.write_text("x")
    with tarfile.open(tmp_path / "bad.tar", "w") as archive:
        archive.add(outside, arcname="../evil.txt")
    with pytest.raises(ValueError, match="not a kiln cache archive"):
        load_cache(tmp_path / "bad.tar", {"cache_dir": str(tmp_path / "cache")})


def test_misses_and_hits_are_logged_with_the_keys_parts(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="kiln.integration"):
        graph_cache_runs.run(str(tmp_path))
        graph_cache_runs.run(str(tmp_path))
    lines = [r.getMessage() for r in caplog.records if "kiln graph cache" in r.getMessage()]
    parts = ("graph ", "inputs ", "state ", "options ", "versions ")
    (miss,) = [line for line in lines if "cache miss" in line]
    (hit,) = [line for line in lines if "cache hit" in line]
    assert all(part in miss and part in hit for part in parts)
    assert miss.split("miss ")[1] == hit.split("hit ")[1]  # the same key, part by part


def test_the_cache_stays_within_its_bound_least_recently_used_first(tmp_path):
    options = {"fallback": False, "cache_dir": str(tmp_path), "graph_cache": True}
    explain(lambda x: x.relu() * 2, torch.randn(4, 8), options=options)
    (first,) = _entries(tmp_path)
    bound = first.stat().st_size + first.with_name(first.name + ".sha256").stat().st_size
    explain(lambda x: x.relu() * 2, torch.randn(4, 9), options={**options, "graph_cache_max_bytes": bound + 100})
    (kept,) = _entries(tmp_path)
    assert kept != first  # the newer entry stays, the older one went


def test_a_damaged_entry_is_rebuilt(tmp_path, caplog):
    graph_cache_runs.run(str(tmp_path))
    (entry,) = _entries(tmp_path)
    good = entry.read_bytes()
    entry.write_bytes(good[: len(good) // 2])
    with caplog.at_level(logging.WARNING):
        rebuilt = graph_cache_runs.run(str(tmp_path))
    assert "rebuilding it" in caplog.text and str(entry) in caplog.text
    assert not rebuilt["reports"][0].cached and rebuilt["kernel_calls"] > 0
    assert GraphCache(entry.parent, 1 << 30).files.verified(entry)  # stored again, whole
    hit = graph_cache_runs.run(str(tmp_path))
    assert hit["reports"][0].cached
    torch.testing.assert_close(hit["outputs"], rebuilt["outputs"])


def test_an_entry_whose_kernel_library_is_damaged_is_rebuilt(tmp_path, caplog, monkeypatch):
    from kiln.codegen_cpp._internal import runtime

    first = graph_cache_runs.run(str(tmp_path))
    (library,) = (tmp_path / "cpp").glob("*/kernels.so")
    garbage = library.with_name("garbage")
    garbage.write_bytes(b"\0" * 64)
    os.replace(garbage, library)  # a new file: the library this process has open stays intact
    monkeypatch.setattr(runtime, "_opened", {})  # as in a fresh process: nothing opened yet
    with caplog.at_level(logging.WARNING):
        rebuilt = graph_cache_runs.run(str(tmp_path))
    assert "cannot be loaded" in caplog.text and "LibraryUnavailable" in caplog.text
    assert not rebuilt["reports"][0].cached and rebuilt["kernel_calls"] > 0
    torch.testing.assert_close(rebuilt["outputs"], first["outputs"])


def _captured(fn, *args):
    graphs = []

    def recorder(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=recorder)(*args)
    (graph,) = graphs
    return graph


def _key(graph, options=None, parts=False):
    resolved = KilnOptions.create(options)
    key = graph_key(*graph, resolved, codegens.select("cpu", resolved))
    return key.parts if parts else key.digest


def test_the_key_changes_with_dtype_shape_strides_grad_and_options():
    def fn(x):
        return torch.relu(x) * 2

    base = _captured(fn, torch.randn(4, 8))
    assert _key(base, parts=True) == _key(_captured(fn, torch.randn(4, 8)), parts=True)  # the same graph
    variants = {
        "dtype": _key(_captured(fn, torch.randn(4, 8, dtype=torch.float64))),
        "shape": _key(_captured(fn, torch.randn(4, 9))),
        "strides": _key(_captured(fn, torch.randn(8, 4).t())),
        "option": _key(base, {"parallel_threshold": 7}),
        "codegen": _key(base, {"codegen": "reference"}),
        "graph": _key(_captured(lambda x: torch.relu(x) * 3, torch.randn(4, 8))),
    }
    assert len({_key(base), *variants.values()}) == len(variants) + 1, variants
    assert _key(base, {"cache_dir": "/elsewhere", "graph_cache_max_bytes": 5}) == _key(base)  # storage knobs


def test_the_key_changes_with_autocast_the_sdpa_backends_and_the_default_device():
    """State the dispatcher reads while AOTAutograd traces, outside the captured graph: autocast
    (its device and dtype), which SDPA backends are enabled (the attention op a CUDA graph
    traces to) and the default device (of factory calls without one). Dynamo recompiles on autocast changes; the same graph text then needs another key."""
    base = _captured(lambda x: torch.relu(x) * 2, torch.randn(4, 8))
    keys = {_key(base)}
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype):
            keys.add(_key(base))
    flash = torch.backends.cuda.flash_sdp_enabled()
    try:
        torch.backends.cuda.enable_flash_sdp(not flash)
        keys.add(_key(base))
    finally:
        torch.backends.cuda.enable_flash_sdp(flash)
    try:
        torch.set_default_device("meta")
        keys.add(_key(base))
    finally:
        torch.set_default_device(None)
    assert len(keys) == 5
    assert _key(base) in keys  # the state restored, the first key again


def test_the_key_follows_the_global_state_dynamo_guards_on():
    """Whatever global state Dynamo recompiles for (here the float32 matmul precision flag, which
    no other part of the key names) gives another key: a recompile never loads an entry stored
    under the old state."""
    base = _captured(lambda x: torch.relu(x) * 2, torch.randn(4, 8))
    assert "dynamo_state={" in dict(_key(base, parts=True))["state"]
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        keys = {_key(base)}
        torch.backends.cuda.matmul.allow_tf32 = not before
        keys.add(_key(base))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert len(keys) == 2


def test_the_key_changes_with_the_graph_passes_the_environment_switches(monkeypatch):
    """KILN_FOLD_CONV_BATCH_NORM=0 / KILN_DENSE_ATTENTION_MASKS=0 change what is generated: a
    graph cached with a pass on is not loaded with it off."""
    from kiln.integration._internal import attention_masks, conv_batch_norm

    base = _captured(lambda x: torch.relu(x) * 2, torch.randn(4, 8))
    keys = {_key(base)}
    monkeypatch.setattr(conv_batch_norm, "ENABLED", False)
    keys.add(_key(base))
    monkeypatch.setattr(attention_masks, "ENABLED", False)
    keys.add(_key(base))
    assert len(keys) == (3 if conv_batch_norm._fused_conv() is not None else 2)


def test_debug_graphs_are_not_cached_and_say_why(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="kiln.integration"):
        report = explain(lambda x: x.relu() * 2, torch.randn(2, 8),
                         options={"fallback": False, "cache_dir": str(tmp_path), "graph_cache": True, "verify": True})
    assert report.kernel_count > 0 and not report.graphs[0].cached
    assert "not used with debug_dir, verify or verify_calls" in caplog.text and not _entries(tmp_path)


def test_training_stages_nest_and_no_entry_is_stored_before_the_backward(tmp_path):
    linear = torch.nn.Linear(8, 4)
    report = explain(lambda x: linear(x).relu().sum(), torch.randn(2, 8),
                     options={"fallback": False, "cache_dir": str(tmp_path), "graph_cache": True})
    assert report.kernel_count > 0 and not report.graphs[0].cached
    assert not _entries(tmp_path)  # explain runs no backward: a training entry needs both halves
    names = [name for name, _ in report.graphs[0].stage_seconds]
    # the forward compiles inside the joint trace: its stages nest under it
    assert "autograd_trace" in names and "autograd_trace/forward_decomp" in names
    assert "forward_decomp [" not in str(report) and "autograd_trace" in str(report).split("time:")[1]


def test_long_compiles_log_each_stage_and_a_summary(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_AFTER_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="kiln.integration.progress"):
        graph_cache_runs.run(str(tmp_path))
    lines = [r.getMessage() for r in caplog.records if r.name == "kiln.integration.progress"]
    assert "is taking a while; stages so far: capture" in lines[0]
    assert any("codegen_cpu" in line for line in lines[1:])
    assert "compiled in" in lines[-1] and "codegen_cpu" in lines[-1] and "decomp" in lines[-1]


def test_lru_eviction_info_and_clear(tmp_path, capsys):
    cache = GraphCache(tmp_path / "graphs", max_bytes=2500)
    cache.files.ensure_directory()
    for age, name in enumerate(["old", "middle", "new"]):
        path = cache.directory / f"{name}.pkl"
        cache.files.write(path, b"x" * 1000)
        os.utime(path, (1000 + age, 1000 + age))
    assert [p.name for p in cache.evict()] == ["old.pkl"]
    assert sorted(p.name for p, _, _ in cache.entries()) == ["middle.pkl", "new.pkl"]
    assert cli(["cache", "info", "--cache-dir", str(tmp_path)]) == 0
    assert "2 entries" in capsys.readouterr().out
    assert cli(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert "removed 2 entries" in capsys.readouterr().out and not list(cache.directory.iterdir())


@pytest.mark.parametrize("value", ["0", "1"])
def test_graph_cache_environment_variable(value):
    assert KilnOptions.create(environ={"KILN_GRAPH_CACHE": value}).graph_cache is (value == "1")


def test_concurrent_stores_of_one_key_leave_a_whole_entry(tmp_path):
    """Writers of the same entry at once (threads here; processes alike: unique temporaries,
    then an atomic rename) leave an entry that verifies and loads; ATen ops pickle by name."""
    import threading

    from kiln.integration import GraphReport
    from kiln.integration._internal.graph_key import GraphKey

    def aten_only(x):
        return torch.ops.aten.mul.Tensor(torch.ops.aten.add.Tensor(x, 1), x)

    module = torch.fx.symbolic_trace(aten_only)
    report = GraphReport(0, True, None, ("aten.add.Tensor",), (), 0, 0, "", ())
    cache = GraphCache(tmp_path / "graphs", 1 << 20)
    key = GraphKey("0" * 32, (("graph", "g"),))
    writers = [threading.Thread(target=cache.store, args=(key, module, report, module)) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    loaded, loaded_report = cache.load(key, module)
    x = torch.randn(3)
    torch.testing.assert_close(loaded(x), aten_only(x))
    assert loaded_report == report and [p.name for p, _, _ in cache.entries()] == [f"{'0' * 32}.pkl"]


def test_a_store_that_cannot_write_warns_and_does_not_raise(tmp_path, caplog):
    """A training graph is stored from its first backward: a full disk or an unusable cache
    directory must not fail the step."""
    from kiln.integration import GraphReport
    from kiln.integration._internal.graph_key import GraphKey

    module = torch.fx.symbolic_trace(lambda x: torch.ops.aten.add.Tensor(x, 1))
    (tmp_path / "a-file").write_text("not a directory")
    cache = GraphCache(tmp_path / "a-file" / "graphs", 1 << 20)
    with caplog.at_level(logging.WARNING):
        cache.store(GraphKey("1" * 32, (("graph", "g"),)), module, GraphReport(0, True, None, (), (), 0, 0, "", ()),
                    module)
    assert "not stored" in caplog.text
