"""Every kiln package's public names import from where ARCHITECTURE.md says, also those its
`__init__` exports lazily (a package-level `__getattr__` importing the defining module on first use)."""

from __future__ import annotations

import importlib
import pathlib
import subprocess
import sys

import pytest

PACKAGES = sorted(p.name for p in (pathlib.Path(__file__).parents[2] / "packages").iterdir()
                  if (p / "pyproject.toml").exists()) + ["integration"]
MODULES = [f"kiln.{name}" for name in PACKAGES] + ["kiln.loopir.codegen"]


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_imports(module_name):
    module = importlib.import_module(module_name)
    for name in module.__all__:
        value = getattr(module, name)
        assert value is getattr(module, name)  # the same object on every access
    namespace: dict = {}
    exec(f"from {module_name} import *", namespace)
    assert set(module.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


def test_a_lazy_name_is_the_defining_modules_object():
    from kiln import autograd_trace, capture, codegen_cpp, loopir
    from kiln.autograd_trace._internal.runtime import AotCompiled
    from kiln.capture._internal.capture import capture as capture_function
    from kiln.codegen_cpp._internal.api import compile as compile_cpp
    from kiln.loopir._internal.api import lower

    assert (loopir.lower, codegen_cpp.compile, capture.capture, autograd_trace.AotCompiled) == (
        lower, compile_cpp, capture_function, AotCompiled)


def test_importing_the_packages_imports_none_of_their_passes():
    """The packages' `__init__`s alone import no lowering, code generation, tracing or capture mode."""
    code = ("import sys; import kiln.loopir, kiln.codegen_cpp, kiln.capture, kiln.autograd_trace, kiln.integration; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('kiln.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported = done.stdout.split()
    passes = ("kiln.loopir._internal.lower", "kiln.loopir._internal.kernel_graph", "kiln.loopir._internal.schedule",
              "kiln.codegen_cpp._internal.api", "kiln.codegen_cpp._internal.function_source",
              "kiln.capture._internal.capture", "kiln.autograd_trace._internal.joint", "kiln.decomp", "kiln.partition",
              "kiln.integration._internal.pipeline")
    assert [m for m in imported if m.startswith(passes)] == []
