"""Compiling generated C++ into a shared library, cached on disk by content hash (loopir's
`ArtifactCache`: a private per-user directory, atomic writes, and a library whose recorded size
and checksum do not match is rebuilt with a warning, never loaded)."""

from __future__ import annotations

import ctypes
import functools
import logging
import pathlib
import platform
import subprocess
import time

from kiln.loopir.codegen import ArtifactCache

from .options import CppOptions

log = logging.getLogger(__name__)


class CppCompileError(RuntimeError):
    """The C++ compiler rejected generated source; the message gives the file and the errors."""


@functools.lru_cache(maxsize=8)
def _compiler_id(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CppCompileError(f"C++ compiler {compiler!r} is not usable: {exc}. "
                              "Install g++ or pass CppOptions(compiler=...)") from exc
    return out.stdout.splitlines()[0] if out.stdout else compiler


@functools.lru_cache(maxsize=1)
def _host_cpu() -> str:
    """What `-march=native` compiles for: a library cached for one CPU may not run on another
    that shares the cache directory."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() + platform.processor()
    wanted = ("model name", "flags", "Features", "CPU part")
    lines = [ln for ln in text.splitlines() if ln.split(":")[0].strip() in wanted]
    return platform.machine() + "\n" + "\n".join(dict.fromkeys(lines))


def build_library(source: str, options: CppOptions) -> tuple[pathlib.Path, bool]:
    """Compile `source` (or reuse the cached library). Returns (library path, cache hit)."""
    command = [options.compiler, *options.flags, "-shared", "-fPIC"]
    command.append("-fopenmp" if options.openmp else "-fopenmp-simd")
    key_parts = [source, *command, str(options.vector_math), _compiler_id(options.compiler)]
    if any(flag.startswith(("-march=native", "-mcpu=native", "-mtune=native")) for flag in command):
        key_parts.append(_host_cpu())
    cache = ArtifactCache(options.cache_dir)
    # The whole cache first: a library found in a directory other users can write to is never
    # trusted, whatever its checksum says.
    cache.ensure_directory()
    directory = cache.ensure_directory(options.cache_dir / cache.key(*key_parts))
    library = directory / "kernels.so"
    if cache.verified(library):
        return library, True
    source_path = directory / "kernels.cpp"
    cache.write(source_path, source)
    # A unique temporary, then an atomic rename: concurrent builders (processes or threads)
    # of the same source never load a half-written library.
    partial = cache.temporary(library, ".so")
    start = time.perf_counter()
    libraries = ["-lmvec"] if options.vector_math else []
    result = subprocess.run([*command, "-o", str(partial), str(source_path), *libraries],
                            capture_output=True, text=True)
    if result.returncode != 0 or not partial.exists():
        partial.unlink(missing_ok=True)
        what = f"exit status {result.returncode}" if result.returncode else "no library written"
        raise CppCompileError(
            f"compiling generated C++ failed ({what}): {' '.join(command)} -o {partial.name} {source_path}\n"
            f"{(result.stderr or result.stdout)[-4000:]}\n"
            "The source is kept at that path. Check CppOptions.compiler/flags; otherwise this is a "
            "kiln.codegen_cpp bug: please report it with the source file.")
    cache.adopt(partial, library)
    log.info("compiled %s in %.2fs", source_path, time.perf_counter() - start)
    return library, False


def load_library(path: pathlib.Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))
