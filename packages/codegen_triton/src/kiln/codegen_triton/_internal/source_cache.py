"""Generated sources on disk, keyed by content hash, imported as real modules.

`triton.jit` reads a kernel's source back from its file (`inspect.getsource`), so generated
code must live in a real file: ``<cache_dir>/kiln_triton_<hash>.py``, written through loopir's
`ArtifactCache` (a private per-user directory, atomic writes, a checksum). A module already imported in this process is reused;
a file on disk whose checksum matches counts as a cache hit (a damaged one is written again).
"""

from __future__ import annotations

import importlib.util
import logging
import pathlib
import sys
import threading
import types

from kiln.loopir.codegen import ArtifactCache

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_MODULES: dict[pathlib.Path, types.ModuleType] = {}


def write_source(source: str, cache_dir: pathlib.Path) -> tuple[pathlib.Path, bool]:
    """Write `source` to the cache unless a verified copy is there. Returns (path, cache hit)."""
    cache = ArtifactCache(cache_dir, "kiln_triton_")
    cache.ensure_directory()  # private to this user before anything in it is trusted
    path = cache.path(cache.key(source), ".py")
    if cache.verified(path):
        return path, True
    cache.write(path, source)  # atomic: a concurrent reader never sees a half-written file
    log.info("wrote generated Triton source %s", path)
    return path, False


def load_module(path: pathlib.Path) -> types.ModuleType:
    """Import the generated module at `path` (once per process)."""
    with _LOCK:
        if path in _MODULES:
            return _MODULES[path]
        name = path.stem
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import generated Triton source {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # triton resolves a kernel's globals through its module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        _MODULES[path] = module
        return module
