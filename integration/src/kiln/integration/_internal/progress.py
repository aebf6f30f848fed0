"""Stage timing of one graph's compile, and progress for long compiles.

`Stages` times the pipeline's stages; stages run inside another one (the training trace
compiles its forward) are recorded under it as ``outer/inner``, so the forward's stages show
inside ``autograd_trace`` rather than beside it. Every finished stage is logged at debug level;
once a compile has run for `PROGRESS_AFTER_SECONDS`, each stage (the earlier ones too, at that
moment) is logged at INFO on the ``kiln.integration.progress`` logger as it finishes, and
`summary()` says where the time went. Nothing configures logging: these lines reach stderr by
themselves only while no handler is configured for the root or ``kiln`` loggers (with
``TORCH_LOGS="+kiln"`` or a logging setup they go where that sends them). Silence them with
``logging.getLogger("kiln.integration.progress").setLevel(logging.WARNING)``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sys
import time
from collections.abc import Iterator

PROGRESS_AFTER_SECONDS = 2.0
log = logging.getLogger("kiln.integration.progress")


class _StderrWhenUnconfigured(logging.Handler):
    """Shows progress on the current stderr when logging is not configured at all (a user
    running a script); otherwise the configured handlers show it, or not."""

    def emit(self, record: logging.LogRecord) -> None:
        if any(logging.getLogger(name).handlers for name in ("", "kiln", "kiln.integration")):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - progress output must never break a compile
            self.handleError(record)


if not log.handlers:
    log.addHandler(_StderrWhenUnconfigured())
if log.level == logging.NOTSET:
    log.setLevel(logging.INFO)


class Stages:
    """Times the stages of compiling `what` (e.g. "graph 3"), from `where` (the user's source
    line, named in the first progress line and the summary)."""

    def __init__(self, what: str, where: str | None = None) -> None:
        self.what = what
        self.where = where
        self.started = time.perf_counter()
        self._records: list[tuple[float, str, float]] = []  # (start offset, path, seconds)
        self._open: list[str] = []
        self._pending: list[str] = []  # stage lines not shown at INFO yet
        self._loud = False

    @property
    def seconds(self) -> tuple[tuple[str, float], ...]:
        """(stage path, seconds) in the order the stages started (outer before inner)."""
        return tuple((path, spent) for _, path, spent in sorted(self._records))

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self._open.append(name)
        path = "/".join(self._open)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._open.pop()
        spent = time.perf_counter() - start
        self._records.append((start - self.started, path, spent))
        self._progress(f"{path} {spent:.2f} s")

    def _progress(self, line: str) -> None:
        if self._loud:
            log.info("kiln: %s: %s", self.what, line)
            return
        self._pending.append(line)
        if time.perf_counter() - self.started < PROGRESS_AFTER_SECONDS:
            log.debug("kiln: %s: stage %s", self.what, line)
            return
        self._loud = True
        log.info("kiln: compiling %s is taking a while; stages so far: %s", self._full_name(),
                 ", ".join(self._pending))

    def _full_name(self) -> str:
        return self.what + (f" ({self.where})" if self.where else "")

    def summary(self, outcome: str = "compiled") -> str:
        """Where the time went: each kind of stage's total (regions added up), largest first;
        an outer stage counts only its own time. Logged at INFO when the compile was long."""
        total = time.perf_counter() - self.started
        own: dict[str, float] = collections.defaultdict(float)
        count: dict[str, int] = collections.Counter()
        outer: set[str] = set()
        for _, path, spent in self._records:
            inner = sum(s for _, p, s in self._records if p.startswith(path + "/") and "/" not in p[len(path) + 1:])
            kind = path.split("/")[-1].split(":")[0]
            own[kind] += spent - inner
            count[kind] += 1
            if inner:
                outer.add(kind)
        parts = [f"{kind}{' (own)' if kind in outer else ''} {seconds:.2f} s"
                 + (f" ({count[kind]} regions)" if count[kind] > 1 else "")
                 for kind, seconds in sorted(own.items(), key=lambda item: -item[1])]
        text = f"kiln: {self._full_name()} {outcome} in {total:.2f} s: " + (", ".join(parts) or "no stages")
        log.log(logging.INFO if total >= PROGRESS_AFTER_SECONDS else logging.DEBUG, "%s", text)
        return text
