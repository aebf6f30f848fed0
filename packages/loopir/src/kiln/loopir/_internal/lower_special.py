"""Lowerings of the torch.special pointwise family and of searches (bucketize, searchsorted),
written as loop bodies over loopir's existing ops (issue 20)."""

from __future__ import annotations

from .registry import Lowerings

TABLE = Lowerings()
