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
import importlib.metadata
import logging
from typing import Any

from kiln import codegen_cpp, codegen_triton, loopir

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "kiln.codegen"
BUILTIN = {"cpu": codegen_cpp.CODEGEN, "cuda": codegen_triton.CODEGEN, "reference": loopir.REFERENCE_CODEGEN}


def as_codegen(name: str, loaded: Any) -> loopir.Codegen:
    """An entry point's object as a `Codegen` (a bare compile function gets default capabilities)."""
    if isinstance(loaded, loopir.Codegen):
        return loaded
    if callable(loaded):
        return loopir.Codegen(name=name, devices=(name,), compile=loaded, artifacts_key=f"kiln_{name}")
    raise TypeError(f"entry point {name!r} of {ENTRY_POINT_GROUP!r} is a {type(loaded).__name__}, "
                    "not a kiln.loopir.Codegen or a compile function")


@functools.lru_cache(maxsize=1)
def registered() -> dict[str, loopir.Codegen]:
    """Every codegen, by name (a plugin that fails to load is skipped with a warning)."""
    found = dict(BUILTIN)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            found[entry.name] = as_codegen(entry.name, entry.load())
        except Exception as error:  # a broken third-party plugin must not break the backend
            log.warning("kiln: codegen entry point %r could not be loaded: %s", entry.name, error)
    return found
