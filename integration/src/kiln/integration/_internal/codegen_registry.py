"""The codegen registry: `kiln.loopir.Codegen` plugins registered under ``kiln.codegen``.

kiln's own codegens register `cpu` (codegen_cpp), `cuda` (codegen_triton) and `reference`
(loopir's reference evaluator) as entry points, as a third party registers its own. A source
tree used without installing (only `PYTHONPATH`) has no entry points: kiln's own three are
then taken directly. A third party's plain ``compile(kernel_graph, options=None)`` function is
accepted as a codegen of default capabilities for the device type it is named after.

`KilnOptions` checks a codegen name against it; `codegens.select` chooses one for a graph.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kiln import loopir

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "kiln.codegen"


def _attribute(module: str, name: str) -> Callable[[], Any]:
    return lambda: getattr(importlib.import_module(module), name)


def as_codegen(name: str, loaded: Any) -> loopir.Codegen:
    """An entry point's object as a `Codegen` (a bare compile function gets default capabilities)."""
    if isinstance(loaded, loopir.Codegen):
        return loaded
    if callable(loaded):
        return loopir.Codegen(name=name, devices=(name,), compile=loaded, artifacts_key=f"kiln_{name}")
    raise TypeError(f"entry point {name!r} of {ENTRY_POINT_GROUP!r} is a {type(loaded).__name__}, "
                    "not a kiln.loopir.Codegen or a compile function")


class LazyCodegens(Mapping[str, loopir.Codegen]):
    """Codegens by name, each loaded (imported) on first access; one that fails to load is
    left out with a warning (a broken third-party plugin must not break the backend). Importing
    a codegen takes a tenth of a second or more: a process compiling, or loading from the
    whole-graph cache, graphs for the CPU only never imports codegen_triton, and one for a GPU
    never imports codegen_cpp."""

    def __init__(self, loaders: Mapping[str, Callable[[], Any]]) -> None:
        self._loaders = dict(loaders)
        self._loaded: dict[str, loopir.Codegen | None] = {}

    def _load(self, name: str) -> loopir.Codegen | None:
        if name not in self._loaded:
            try:
                self._loaded[name] = as_codegen(name, self._loaders[name]())
            except Exception as error:
                log.warning("kiln: codegen %r (%s) could not be loaded: %s", name, ENTRY_POINT_GROUP, error)
                self._loaded[name] = None
        return self._loaded[name]

    def __getitem__(self, name: str) -> loopir.Codegen:
        codegen = self._load(name) if name in self._loaders else None
        if codegen is None:
            raise KeyError(name)
        return codegen

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._loaders if self._load(name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return name in self._loaders and self._load(name) is not None


BUILTIN = LazyCodegens({"cpu": _attribute("kiln.codegen_cpp", "CODEGEN"),
                        "cuda": _attribute("kiln.codegen_triton", "CODEGEN"),
                        "reference": lambda: loopir.REFERENCE_CODEGEN})


@functools.lru_cache(maxsize=1)
def registered() -> Mapping[str, loopir.Codegen]:
    """Every codegen, by name, loaded on first access (see `LazyCodegens`): kiln's own, then the
    entry points (which take the place of kiln's own of the same name)."""
    loaders = dict(BUILTIN._loaders)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        loaders[entry.name] = entry.load
    return LazyCodegens(loaders)
