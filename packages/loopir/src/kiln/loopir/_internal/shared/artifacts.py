"""The content-hash artifact cache: generated sources and built libraries on disk.

Every artifact lives under ``<directory>/<prefix><key><suffix>``, `key` a hash of everything
that determines its content (source, flags, compiler, versions: `ArtifactCache.key`). Writes
are atomic (a unique temporary, then a rename), so concurrent processes never see half a file,
and each file gets a ``.sha256`` sidecar written after it. `verified(path)` checks the file
against its sidecar: a truncated, emptied or replaced artifact is never used (a truncated
shared library would kill the process in the loader), it is rebuilt.

The directory is created private to its user (mode 0700), and one owned by another user is
refused: libraries loaded from it run as the current user.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import threading

log = logging.getLogger(__name__)


class ArtifactCacheError(RuntimeError):
    """The cache directory cannot be used safely."""


class ArtifactCache:
    """Artifacts of one codegen under `directory` (see the module docstring)."""

    def __init__(self, directory: pathlib.Path | str, prefix: str = "") -> None:
        self.directory = pathlib.Path(directory)
        self.prefix = prefix

    @staticmethod
    def key(*parts: str | bytes) -> str:
        digest = hashlib.sha256()
        for part in parts:
            digest.update(part.encode() if isinstance(part, str) else part)
            digest.update(b"\0")
        return digest.hexdigest()[:24]

    def path(self, key: str, suffix: str = "") -> pathlib.Path:
        return self.directory / f"{self.prefix}{key}{suffix}"

    def ensure_directory(self, directory: pathlib.Path | None = None) -> pathlib.Path:
        """Create `directory` (default: the cache's) private to this user; refuse another's."""
        directory = self.directory if directory is None else directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        owner = directory.stat().st_uid
        if hasattr(os, "getuid") and owner != os.getuid():
            raise ArtifactCacheError(f"artifact cache directory {directory} belongs to user {owner}, not to this "
                                     "user; kiln will not load generated code from it. Choose another cache_dir")
        return directory

    def write(self, path: pathlib.Path, data: str | bytes) -> None:
        """Write `data` to `path` atomically, then its checksum sidecar."""
        self.ensure_directory(path.parent)
        raw = data.encode() if isinstance(data, str) else data
        _atomic_write(path, raw)
        _atomic_write(_sidecar(path), hashlib.sha256(raw).hexdigest().encode())

    def adopt(self, partial: pathlib.Path, path: pathlib.Path) -> None:
        """Move a file built elsewhere in the directory (a compiler's output) to `path`
        atomically, with its checksum sidecar."""
        digest = hashlib.sha256(partial.read_bytes()).hexdigest()
        os.replace(partial, path)
        _atomic_write(_sidecar(path), digest.encode())

    def verified(self, path: pathlib.Path) -> bool:
        """Whether `path` exists and has the content its sidecar records."""
        try:
            expected = _sidecar(path).read_text().strip()
            actual = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            return False
        if actual != expected:
            log.warning("cached artifact %s does not match its checksum (truncated or replaced): rebuilding it", path)
            return False
        return True

    def temporary(self, path: pathlib.Path, suffix: str = "") -> pathlib.Path:
        """A unique name beside `path` for a file being built (no two builders share one)."""
        return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp{suffix}")


def _sidecar(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + ".sha256")


def _atomic_write(path: pathlib.Path, raw: bytes) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_bytes(raw)
    os.replace(partial, path)
