"""The content-hash artifact cache: generated sources and built libraries on disk.

Every artifact lives under ``<directory>/<prefix><key><suffix>``, `key` a hash of everything
that determines its content (source, flags, compiler, versions: `ArtifactCache.key`). Writes
are atomic (a unique temporary, then a rename), so concurrent processes never see half a file,
and each file gets a ``.sha256`` sidecar (its hash and size) written after it. `verified(path)`
checks the file against its sidecar before anyone loads it: a truncated, emptied or replaced
artifact is never used (a truncated shared library would kill the process in the loader), it is
rebuilt, with a warning.

The default place is per user, `default_cache_root()` (``$XDG_CACHE_HOME/kiln``, else
``~/.cache/kiln``), never a fixed path in the shared temp directory. Directories are created
private to their user (mode 0700); one owned by another user, or that other users may write
to, is refused: libraries loaded from it run as the current user.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import stat
import tempfile
import threading

log = logging.getLogger(__name__)


class ArtifactCacheError(RuntimeError):
    """The cache directory cannot be used safely."""


def default_cache_root() -> pathlib.Path:
    """Where kiln caches generated code unless told otherwise: ``$XDG_CACHE_HOME/kiln`` (an
    absolute XDG_CACHE_HOME only, as the XDG spec says), else ``~/.cache/kiln``; without a home
    directory kiln can write to (a bare container user), a per-user directory in the temp
    directory (`ensure_directory` makes it private and refuses one another user made)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(base):
        return pathlib.Path(base) / "kiln"
    try:
        candidate = pathlib.Path.home() / ".cache" / "kiln"
    except RuntimeError:
        candidate = None
    if candidate is not None and _creatable(candidate):
        return candidate
    user = os.getuid() if hasattr(os, "getuid") else os.getlogin()
    return pathlib.Path(tempfile.gettempdir()) / f"kiln-cache-{user}"


def _creatable(path: pathlib.Path) -> bool:
    """Whether `path` exists as a directory or this user could create it."""
    for ancestor in (path, *path.parents):
        if ancestor.exists():
            return ancestor.is_dir() and os.access(ancestor, os.W_OK | os.X_OK)
    return False


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
        if not hasattr(os, "getuid"):
            return directory
        info = directory.stat()
        if info.st_uid != os.getuid():
            raise ArtifactCacheError(f"artifact cache directory {directory} belongs to user {info.st_uid}, not to this "
                                     "user; kiln will not load generated code from it. Choose another cache_dir")
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ArtifactCacheError(
                f"artifact cache directory {directory} is writable by other users (mode "
                f"{stat.S_IMODE(info.st_mode):o}); kiln will not load generated code from it. Make it private "
                f"(chmod 700 {directory}, after emptying it) or choose another cache_dir")
        return directory

    def write(self, path: pathlib.Path, data: str | bytes) -> None:
        """Write `data` to `path` atomically, then its checksum sidecar."""
        self.ensure_directory(path.parent)
        raw = data.encode() if isinstance(data, str) else data
        _atomic_write(path, raw)
        _atomic_write(_sidecar(path), _fingerprint(raw))

    def adopt(self, partial: pathlib.Path, path: pathlib.Path) -> None:
        """Move a file built elsewhere in the directory (a compiler's output) to `path`
        atomically, with its checksum sidecar."""
        fingerprint = _fingerprint(partial.read_bytes())
        os.replace(partial, path)
        _atomic_write(_sidecar(path), fingerprint)

    def verified(self, path: pathlib.Path) -> bool:
        """Whether `path` exists and has the size and content its sidecar records (read here,
        before anything loads the file)."""
        try:
            expected = _sidecar(path).read_bytes().strip()
        except OSError:
            if path.exists():
                log.warning("cached artifact %s has no checksum (a partial entry): rebuilding it", path)
            return False
        try:
            size = path.stat().st_size
            matches = expected.endswith(b" %d" % size) and _fingerprint(path.read_bytes()) == expected
        except OSError:
            matches = False
        if not matches:
            log.warning("cached artifact %s does not match its recorded size and checksum (truncated, emptied or "
                        "replaced): rebuilding it", path)
        return matches

    def temporary(self, path: pathlib.Path, suffix: str = "") -> pathlib.Path:
        """A unique name beside `path` for a file being built (no two builders share one)."""
        return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp{suffix}")


def _fingerprint(raw: bytes) -> bytes:
    """What a sidecar records: the content's sha256 and its size in bytes."""
    return b"%s %d" % (hashlib.sha256(raw).hexdigest().encode(), len(raw))


def _sidecar(path: pathlib.Path) -> pathlib.Path:
    return path.with_name(path.name + ".sha256")


def _atomic_write(path: pathlib.Path, raw: bytes) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_bytes(raw)
    os.replace(partial, path)
