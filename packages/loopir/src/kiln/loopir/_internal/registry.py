"""The table of ATen lowerings: op -> function building loopir values.

Each `lower_*.py` module fills its own `Lowerings` object with the `@table.register(op, ...)`
decorator right above the implementation; `default_lowerings()` returns a fresh merged
table, so a caller can add or remove entries without touching anyone else's.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

LoweringFn = Callable[..., Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Lowering:
    fn: LoweringFn
    kind: str  # "pointwise" | "reduction" | "view" | "extern" | "constant"
    # Whether `fn` lowers this particular node (None: every node of the op): partitioners
    # leave the others out of loopir's regions (see `lowerable`).
    check: Callable[[Any], bool] | None = None


class Lowerings(Mapping[torch._ops.OpOverload, Lowering]):
    def __init__(self, entries: Mapping[torch._ops.OpOverload, Lowering] | None = None) -> None:
        self._entries: dict[torch._ops.OpOverload, Lowering] = dict(entries or {})

    def register(self, kind: str, *ops: torch._ops.OpOverload,
                 check: Callable[[Any], bool] | None = None) -> Callable[[LoweringFn], LoweringFn]:
        def decorate(fn: LoweringFn) -> LoweringFn:
            for op in ops:
                if op in self._entries:
                    raise ValueError(f"{op} already has a lowering ({self._entries[op].fn.__name__})")
                self._entries[op] = Lowering(fn, kind, check)
            return fn

        return decorate

    def __getitem__(self, op: torch._ops.OpOverload) -> Lowering:
        return self._entries[op]

    def __iter__(self) -> Iterator[torch._ops.OpOverload]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __or__(self, other: Lowerings) -> Lowerings:
        return Lowerings({**self._entries, **other._entries})


def default_lowerings() -> Lowerings:
    """A fresh table with every lowering loopir ships."""
    from . import (
        lower_attention,
        lower_indexing,
        lower_pointwise,
        lower_pooling,
        lower_pooling_fractional,
        lower_random,
        lower_reduction,
        lower_scan,
        lower_scatter,
        lower_segments,
        lower_special,
        lower_views,
    )

    return (lower_pointwise.TABLE | lower_attention.TABLE | lower_reduction.TABLE | lower_views.TABLE | lower_indexing.TABLE
            | lower_pooling.TABLE | lower_pooling_fractional.TABLE | lower_special.TABLE | lower_random.TABLE | lower_scan.TABLE
            | lower_scatter.TABLE | lower_segments.TABLE)


def supported_ops(lowerings: Lowerings | None = None) -> frozenset[torch._ops.OpOverload]:
    """The ATen ops loopir can lower with `lowerings` (None: the default table), for
    partitioners: the same table `lower` gets through `LowerOptions.lowerings`."""
    return frozenset(lowerings if lowerings is not None else default_lowerings())


def lowerable(node: Any, lowerings: Lowerings | None = None) -> bool:
    """Whether loopir lowers this FX node: its op has a lowering whose `check` (if any)
    accepts the node. A partition predicate next to `supported_ops`."""
    table = lowerings if lowerings is not None else _default_table()
    entry = table.get(getattr(node, "target", None))
    return entry is not None and (entry.check is None or bool(entry.check(node)))


@functools.cache
def _default_table() -> Lowerings:
    return default_lowerings()
