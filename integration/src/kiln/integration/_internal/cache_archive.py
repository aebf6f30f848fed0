"""Portable caches: `save_cache(path)` packs kiln's cache directory (whole-graph entries and the
kernel artifacts they load) into one archive; `load_cache(path)` unpacks it into this machine's
cache, as `torch.compiler.save_cache_artifacts` / `load_cache_artifacts` do for Inductor.

Entries name their artifacts relative to the cache directory (see `graph_cache`), so the cache
may be unpacked under another path. Keys include the CPU, the compiler, torch's and kiln's
versions: a cache made on another kind of machine loads but misses. Every file keeps its
checksum sidecar and is checked before it is used, as any cached artifact is.
"""

from __future__ import annotations

import logging
import os
import pathlib
import tarfile
import tempfile
from typing import Any

from kiln.loopir.codegen import ArtifactCache, default_cache_root

from .graph_cache import SUFFIX
from .options import KilnOptions

log = logging.getLogger(__name__)


def _cache_directory(options: dict[str, Any] | KilnOptions | None) -> pathlib.Path:
    resolved = KilnOptions.create(options)
    return resolved.cache_dir if resolved.cache_dir is not None else default_cache_root()


def save_cache(path: str | os.PathLike[str], options: dict[str, Any] | KilnOptions | None = None) -> int:
    """Write kiln's cache directory (``options["cache_dir"]``, else ``KILN_CACHE_DIR``, else the
    per-user default) to the archive `path` (a tar file); returns how many whole-graph entries
    it holds."""
    root = _cache_directory(options)
    entries = 0
    with tarfile.open(path, "w") as archive:
        for file in sorted(root.rglob("*")) if root.is_dir() else []:
            if file.is_file() and not file.is_symlink() and not file.name.startswith("."):
                archive.add(file, arcname=file.relative_to(root).as_posix(), recursive=False)
                entries += file.parent.name == "graphs" and file.name.endswith(SUFFIX)
    log.info("kiln: saved %d whole-graph entries of %s to %s", entries, root, path)
    return entries


def load_cache(path: str | os.PathLike[str], options: dict[str, Any] | KilnOptions | None = None) -> int:
    """Unpack the archive `save_cache` wrote into kiln's cache directory (chosen as there);
    returns how many whole-graph entries it added. Files already there are kept."""
    root = _cache_directory(options)
    files = ArtifactCache(root)
    files.ensure_directory()
    added = 0
    with tarfile.open(path, "r") as archive, tempfile.TemporaryDirectory(dir=root, prefix=".load-") as scratch:
        members = [m for m in archive.getmembers() if m.isfile()]
        for member in members:
            _check_name(member.name, path)
        archive.extractall(scratch, members=members, **_safe_extraction())
        for member in members:
            target = root / member.name
            files.ensure_directory(target.parent)
            if target.exists():
                continue
            os.replace(pathlib.Path(scratch) / member.name, target)  # atomic: a reader sees none or all
            added += target.parent.name == "graphs" and target.name.endswith(SUFFIX)
    log.info("kiln: loaded %d whole-graph entries from %s into %s", added, path, root)
    return added


def _check_name(name: str, archive: str | os.PathLike[str]) -> None:
    relative = pathlib.PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise ValueError(f"{archive} is not a kiln cache archive: it holds the path {name!r}")


def _safe_extraction() -> dict[str, Any]:
    """Python's data filter where it has one (3.10.12+, 3.11.4+): no links, devices or modes
    beyond the user's; names are checked by `_check_name` either way."""
    return {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
