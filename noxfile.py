"""kiln's task runner. `nox -s demo` runs the demo, `nox -s tests` runs every test.

Every install goes through constraints.txt, the single place torch is pinned.
"""

from __future__ import annotations

import pathlib
import tomllib

import nox

ROOT = pathlib.Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
PACKAGES = ["capture", "decomp", "autograd_trace", "partition", "loopir", "codegen_cpp", "codegen_triton"]

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]


def _project_dir(name: str) -> pathlib.Path:
    return ROOT / "integration" if name == "integration" else ROOT / "packages" / name


def _kiln_dependencies(name: str) -> list[str]:
    """Local kiln packages that `name` declares, in install order (dependencies first)."""
    meta = tomllib.loads((_project_dir(name) / "pyproject.toml").read_text())["project"]
    local = []
    for requirement in meta.get("dependencies", []):
        if requirement.startswith("kiln-"):
            dep = requirement.removeprefix("kiln-").replace("-", "_")
            local += [d for d in _kiln_dependencies(dep) + [dep] if d not in local]
    return local


def _install(session: nox.Session, *args: str) -> None:
    session.install(*CONSTRAINTS, *args)


@nox.session
def tests(session: nox.Session) -> None:
    """Every package installed (editable) into one venv; all tests, one pytest worker per core
    (at most 4; `nox -s tests -- -n 0` runs them in one process)."""
    _install_for_tests(session)
    _install(session, "pytest-xdist")
    session.run("pytest", "-n", "auto", "--maxprocesses", "4", "--dist", "loadgroup", "--durations=30",
                *session.posargs,
                env={"TRITON_INTERPRET": "1"})


def _install_for_tests(session: nox.Session) -> None:
    """torch, then every package editable with its test extras."""
    _install(session, "torch")
    editable = []
    for name in PACKAGES:
        editable += ["-e", f"{_project_dir(name)}[test]"]
    _install(session, *editable, "-e", f"{ROOT / 'integration'}[test]", "expecttest")


@nox.session
def distributed(session: nox.Session) -> None:
    """DDP, FSDP2 per-block compile, compiled autograd and DDP's python_reducer through kiln: two
    CPU processes over gloo, an MLP and a small GPT-2, each against the same training uncompiled."""
    _install_for_tests(session)  # integration's test extras bring transformers
    session.run("pytest", "-p", "no:cacheprovider",
                str(ROOT / "integration" / "tests" / "test_integration_distributed.py"),
                *session.posargs, env={"KILN_DISTRIBUTED": "1"})


@nox.session
def op_table(session: nox.Session) -> None:
    """The ops x dtypes x {reference, C++, Triton} table on every OpInfo sample (CI runs a subset)."""
    _install_for_tests(session)
    session.run("pytest", "-p", "no:cacheprovider", str(ROOT / "integration" / "tests" / "test_integration_op_table.py"),
                *session.posargs, env={"TRITON_INTERPRET": "1", "KILN_OP_TABLE": "full"})


@nox.session
@nox.parametrize("name", PACKAGES + ["integration"])
def package(session: nox.Session, name: str) -> None:
    """One package alone: only it and its declared dependencies, then its own tests."""
    _install(session, "torch")
    for dep in _kiln_dependencies(name):
        _install(session, str(_project_dir(dep)))
    _install(session, f"{_project_dir(name)}[test]")
    # Run from a scratch directory so nothing in the checkout shadows the installed package.
    tests_dir = _project_dir(name) / "tests"
    session.chdir(session.create_tmp())
    session.run("pytest", "-p", "no:cacheprovider", "--rootdir", ".", "--import-mode=importlib",
                "-q", str(tests_dir), *session.posargs, env={"TRITON_INTERPRET": "1"})


def _install_all(session: nox.Session) -> None:
    _install(session, "torch")
    args = []
    for name in PACKAGES + ["integration"]:
        args.append(str(_project_dir(name)))
    _install(session, *args)


@nox.session
def demo(session: nox.Session) -> None:
    """Compile a small model with backend="kiln" on CPU and print a comparison table."""
    _install_all(session)
    session.run("python", str(ROOT / "tools" / "demo.py"), *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """eager vs Inductor vs kiln: median run times and compile times, as a table."""
    _install_all(session)
    _install(session, "transformers")
    session.run("python", str(ROOT / "tools" / "bench.py"), *session.posargs)


@nox.session
def coverage(session: nox.Session) -> None:
    """Which ATen ops become kiln kernels, externs or eager fallbacks: OpInfo samples and HF models."""
    _install_all(session)
    _install(session, "transformers", "expecttest")
    session.run("python", str(ROOT / "tools" / "coverage.py"), *(session.posargs or ["--models"]))


@nox.session
def gpu_check(session: nox.Session) -> None:
    """HF training gradients on a GPU, kiln and Inductor vs eager (tools/gpu_check.py; needs CUDA)."""
    _install_all(session)
    _install(session, "transformers")
    session.run("python", str(ROOT / "tools" / "gpu_check.py"), *session.posargs)


@nox.session
def fuzz(session: nox.Session) -> None:
    """Differential fuzzer: random programs through the C++ codegen and the Triton interpreter,
    static and dynamic shapes, fallback=False, vs eager (tools/fuzz.py; posargs go to it, e.g.
    `nox -s fuzz -- --programs 2000 --workers 8`). Fails if any result is wrong."""
    _install_all(session)
    session.run("python", str(ROOT / "tools" / "fuzz.py"), *(session.posargs or ["--programs", "2000"]),
                env={"TRITON_INTERPRET": "1"})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, and a check that no package imports a kiln package it does not declare."""
    session.install("ruff")
    session.run("ruff", "check", str(ROOT))
    session.run("python", str(ROOT / "tools" / "check_imports.py"))


def _run_package_tool(session: nox.Session, name: str, script: str, *extra: str) -> None:
    """Install `name` (with its kiln dependencies) and run one of its tools/ scripts."""
    _install(session, "torch")
    for dep in _kiln_dependencies(name):
        _install(session, str(_project_dir(dep)))
    _install(session, str(_project_dir(name)), *extra)
    session.run("python", str(_project_dir(name) / "tools" / script), *session.posargs)


@nox.session
def opinfo_decomp(session: nox.Session) -> None:
    """decomp: every decomposition in core_aten()/loop_level() vs eager on all OpInfo samples."""
    _run_package_tool(session, "decomp", "opinfo_decomp.py", "expecttest", "numpy")


@nox.session
def opinfo_grad(session: nox.Session) -> None:
    """autograd_trace: aot_compile (eager compilers) vs eager outputs and gradients over op_db."""
    _run_package_tool(session, "autograd_trace", "opinfo_grad.py", "expecttest", "numpy")


@nox.session
def activation_memory(session: nox.Session) -> None:
    """autograd_trace: bytes saved for backward, save_all vs min_cut."""
    _run_package_tool(session, "autograd_trace", "activation_memory.py", "transformers")


@nox.session
def bench_partition(session: nox.Session) -> None:
    """partition: kiln's partitioner vs torch's CapabilityBasedPartitioner on random DAGs."""
    _run_package_tool(session, "partition", "bench_partition.py")


@nox.session
def capture_roundtrip(session: nox.Session) -> None:
    """capture: save/load round trip of every graph of the HF models (from configs)."""
    _run_package_tool(session, "capture", "hf_roundtrip.py", "transformers")
