"""Exceptions raised by kiln.autograd_trace."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class TraceError(RuntimeError):
    """Tracing a Torch-IR graph to functional ATen failed.

    The message names the graph node, its op and the user source line it came from; the
    original exception is chained as ``__cause__``.
    """


class VerifyError(AssertionError):
    """A graph breaks the functional-ATen output contract of kiln.autograd_trace."""
