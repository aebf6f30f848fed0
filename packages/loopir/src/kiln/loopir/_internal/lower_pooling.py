"""Lowerings of window reductions: avg/max pooling (1-3d) and adaptive pooling, their backward
ops, and upsample backward, as loop-level reductions over windows (issue 20)."""

from __future__ import annotations

from .registry import Lowerings

TABLE = Lowerings()
