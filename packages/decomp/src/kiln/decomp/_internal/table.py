"""DecompTable: an immutable ``OpOverload -> decomposition`` mapping with provenance.

Semantics of the set algebra (every operation returns a new table; none mutates):

``a | b``
    Union; on an op present in both, ``b``'s entry (function and provenance) wins.
    The kept sets are united, and every kept op is absent from the result: a ``keep``
    made on either side is a promise that survives union.
``a - ops``
    ``a`` without the entries for ``ops``. The kept set is unchanged, so an op removed
    with ``-`` can come back through a later ``|``.
``a.keep(ops)``
    ``a`` without the entries for ``ops``, and ``ops`` added to the kept set, so that no
    later ``|`` (from either side) adds a decomposition for them back. Only ``register``
    on the table itself undoes a keep (it is the one explicit way to say "decompose
    this op with this function").
``a.only(ops)``
    ``a`` restricted to the entries for ``ops``; kept set unchanged.

``ops`` is an OpOverload, an OpOverloadPacket (all its overloads) or an iterable of them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from torch._ops import OpOverload

from .ops import OpLike, expand_ops

log = logging.getLogger(__name__)

PROVENANCES = ("torch", "kiln", "user")

Decomposition = Callable[..., Any]


class DecompTable(Mapping[OpOverload, Decomposition]):
    """An immutable, hashable mapping ``OpOverload -> decomposition function``.

    Each entry records where it came from: ``"torch"`` (a ``torch._decomp`` function),
    ``"kiln"`` (written in kiln.decomp) or ``"user"`` (added with ``register``).
    Build one with ``DecompTable(mapping, provenance="user")`` (every entry gets that
    provenance; a DecompTable argument is copied as it is, provenance and kept set
    included), with the built-in ``core_aten()`` / ``loop_level()``, or with ``register``. Pass it anywhere a
    decomposition mapping is expected (``make_fx(decomposition_table=...)`` included).
    """

    __slots__ = ("_entries", "_kept", "_hash")

    def __init__(
        self,
        entries: Mapping[OpOverload, Decomposition] | None = None,
        *,
        provenance: str = "user",
    ) -> None:
        if isinstance(entries, DecompTable):
            table: dict[OpOverload, tuple[Decomposition, str]] = dict(entries._entries)
            kept = entries._kept
        else:
            _check_provenance(provenance)
            table = {op: (fn, provenance) for op, fn in (entries or {}).items()}
            kept = frozenset()
        for op, (fn, _) in table.items():
            _check_entry(op, fn)
        object.__setattr__(self, "_entries", MappingProxyType(table))
        object.__setattr__(self, "_kept", frozenset(kept))
        object.__setattr__(self, "_hash", None)

    @classmethod
    def _build(
        cls,
        entries: Mapping[OpOverload, tuple[Decomposition, str]],
        kept: frozenset[OpOverload],
    ) -> DecompTable:
        table = cls.__new__(cls)
        object.__setattr__(table, "_entries", MappingProxyType(dict(entries)))
        object.__setattr__(table, "_kept", frozenset(kept))
        object.__setattr__(table, "_hash", None)
        return table

    # -- Mapping protocol -------------------------------------------------------------
    def __getitem__(self, op: OpOverload) -> Decomposition:
        return self._entries[op][0]

    def __iter__(self) -> Iterator[OpOverload]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, op: object) -> bool:
        return op in self._entries

    # -- immutability, equality, hashing ----------------------------------------------
    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"DecompTable is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"DecompTable is immutable; cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DecompTable):
            return self._entries == other._entries and self._kept == other._kept
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            value = hash((frozenset(self._entries.items()), self._kept))
            object.__setattr__(self, "_hash", value)
        return self._hash

    # -- provenance and printing -------------------------------------------------------
    def provenance(self, op: OpOverload) -> str:
        """Where the entry for ``op`` comes from: ``"torch"``, ``"kiln"`` or ``"user"``."""
        try:
            return self._entries[op][1]
        except KeyError:
            hint = " (it is kept: never decomposed)" if op in self._kept else ""
            raise KeyError(f"{op} has no entry in this DecompTable{hint}") from None

    @property
    def kept(self) -> frozenset[OpOverload]:
        """Ops this table promises never to decompose (see ``keep``)."""
        return self._kept

    def listing(self) -> str:
        """A readable listing: one ``op  provenance`` line per entry, sorted by op name."""
        rows = sorted((str(op), prov) for op, (_, prov) in self._entries.items())
        width = max((len(name) for name, _ in rows), default=0)
        lines = [self._summary()]
        lines += [f"  {name:<{width}}  {prov}" for name, prov in rows]
        if self._kept:
            lines.append(f"kept (never decomposed): {len(self._kept)} ops")
            lines += [f"  {name}" for name in sorted(str(op) for op in self._kept)]
        return "\n".join(lines)

    def _summary(self) -> str:
        counts = Counter(prov for _, prov in self._entries.values())
        parts = ", ".join(f"{p}={counts[p]}" for p in PROVENANCES if counts[p])
        return f"DecompTable: {len(self)} entries ({parts or 'empty'}), {len(self._kept)} kept"

    def __str__(self) -> str:
        return self.listing()

    def __repr__(self) -> str:
        return f"<{self._summary()}>"

    # -- set algebra ---------------------------------------------------------------------
    def __or__(self, other: Mapping[OpOverload, Decomposition]) -> DecompTable:
        if not isinstance(other, Mapping):
            return NotImplemented
        other_table = other if isinstance(other, DecompTable) else DecompTable(other)
        kept = self._kept | other_table._kept
        merged = {**self._entries, **other_table._entries}
        return DecompTable._build(_without(merged, kept), kept)

    def __ror__(self, other: Mapping[OpOverload, Decomposition]) -> DecompTable:
        if not isinstance(other, Mapping):
            return NotImplemented
        return DecompTable(other) | self

    def __sub__(self, ops: OpLike | Iterable[OpLike]) -> DecompTable:
        return DecompTable._build(_without(self._entries, expand_ops(ops)), self._kept)

    def keep(self, ops: OpLike | Iterable[OpLike]) -> DecompTable:
        """A table that never decomposes ``ops``: their entries are removed now, and the
        ops are remembered so that no later ``|`` adds them back (see module docstring)."""
        kept = self._kept | expand_ops(ops)
        return DecompTable._build(_without(self._entries, kept), kept)

    def only(self, ops: OpLike | Iterable[OpLike]) -> DecompTable:
        """This table restricted to the entries for ``ops`` (kept set unchanged)."""
        wanted = expand_ops(ops)
        return DecompTable._build(
            {op: entry for op, entry in self._entries.items() if op in wanted}, self._kept
        )

    def _with_entries(
        self, entries: Mapping[OpOverload, Decomposition], provenance: str
    ) -> DecompTable:
        _check_provenance(provenance)
        for op, fn in entries.items():
            _check_entry(op, fn)
        merged = {**self._entries, **{op: (fn, provenance) for op, fn in entries.items()}}
        return DecompTable._build(merged, self._kept - frozenset(entries))


def register(
    table: DecompTable, ops: OpLike | Iterable[OpLike], fn: Decomposition | None = None
) -> Any:
    """Add a user decomposition to ``table``, returning a NEW table (``table`` is unchanged).

    Two spellings::

        table = register(table, torch.ops.aten.foo.default, my_foo)
        table = register(table, torch.ops.aten.foo.default)(my_foo)   # decorator form

    In decorator form the decorated name is bound to the new table, so write it as
    ``table = register(table, op)(fn)`` rather than with ``@`` over a ``def`` unless that
    is what you want. ``ops`` may be an OpOverload, a packet (all overloads) or an
    iterable of them. The entries get provenance ``"user"``; registering an op that
    ``table`` keeps removes it from the kept set (an explicit registration wins).
    ``fn`` takes the op's arguments and returns its outputs, or ``NotImplemented`` to
    leave that call undecomposed.
    """
    if not isinstance(table, DecompTable):
        raise TypeError(f"register expects a DecompTable, got {type(table).__name__}")
    overloads = expand_ops(ops)

    def add(function: Decomposition) -> DecompTable:
        return table._with_entries({op: function for op in overloads}, "user")

    return add if fn is None else add(fn)


def _without(
    entries: Mapping[OpOverload, tuple[Decomposition, str]], ops: frozenset[OpOverload]
) -> dict[OpOverload, tuple[Decomposition, str]]:
    return {op: entry for op, entry in entries.items() if op not in ops}


def _check_provenance(provenance: str) -> None:
    if provenance not in PROVENANCES:
        raise ValueError(f"provenance must be one of {PROVENANCES}, got {provenance!r}")


def _check_entry(op: object, fn: object) -> None:
    if not isinstance(op, OpOverload):
        raise TypeError(
            f"DecompTable keys must be OpOverloads (e.g. torch.ops.aten.add.Tensor), got {op!r}"
        )
    if not callable(fn):
        raise TypeError(f"the decomposition for {op} is not callable: {fn!r}")
