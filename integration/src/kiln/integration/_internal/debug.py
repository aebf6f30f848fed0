"""KILN_DEBUG dumps: one directory per graph, one file per stage, numbered in pipeline order."""

from __future__ import annotations

import itertools
import logging
import os
import pathlib
from collections.abc import Callable

log = logging.getLogger(__name__)
_graph_ids = itertools.count()  # names debug directories uniquely within this process


class DebugDump:
    """Writes stage files under `<root>/graph_<pid>_<n>/`; does nothing when root is None."""

    def __init__(self, root: pathlib.Path | None) -> None:
        self.directory = None
        if root is not None:
            self.directory = pathlib.Path(root) / f"graph_{os.getpid()}_{next(_graph_ids):03d}"
            self.directory.mkdir(parents=True, exist_ok=True)
            log.info("kiln debug dump: %s", self.directory)
        self._count = 0

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def write(self, stage: str, text: str | Callable[[], str], suffix: str = ".txt") -> None:
        """Write `text` (or what the callable returns: only called when dumping is on)."""
        if self.directory is None:
            return
        path = self.directory / f"{self._count:02d}_{stage}{suffix}"
        self._count += 1
        path.write_text(text() if callable(text) else text)
