"""Lowerings of random-number ops (rand, randn, randint, bernoulli, dropout) on a counter-based
generator: a seed drawn from torch's generator per call, an offset per element (issue 20)."""

from __future__ import annotations

from .registry import Lowerings

TABLE = Lowerings()
