"""Finding pattern occurrences: `Match`, the per-graph index and the matching walk.

A match starts at the pattern's anchor (an output) and a graph node with the same op key,
then follows arguments backwards: a pattern node's arguments must match the graph node's
(normalized) arguments position by position, placeholders bind to whatever value is there
(consistently), literals compare exactly or are captured. Pattern nodes not reached from the
anchor (other outputs) are found among the users of nodes already matched, with
backtracking. A candidate is accepted when, in addition:

- the mapping is one-to-one and no placeholder is bound to a node of the match;
- no intermediate escapes: a matched node that is not a pattern output has no user outside
  the match;
- for several outputs, the match is convex: no bound input depends on a matched node;
- a view/reshape pair of different aliasing kinds is only accepted when nothing mutates
  the values involved;
- the pattern's `check(match)` accepts it.

The graph is walked once, from its last node to its first; at each node the patterns
anchored on its op key are tried in order and the first acceptable match that overlaps no
match found so far wins, so the result is non-overlapping and deterministic. Matches are
returned in graph order of their anchors.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from .effects import effects_of
from .meta import node_value
from .opkeys import GET_ATTR_KEY, RESHAPE_KEY, normalized_args, op_key, reshape_kind
from .pattern import Pattern, _fetch, literal_equal

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Match:
    """One occurrence of `pattern` in a graph.

    `nodes` maps each pattern node (not placeholders) to its graph node; `bindings` maps
    each placeholder name to the graph value it stands for (a node or a literal; unused
    placeholders are absent); `outputs` are the graph nodes of the pattern outputs, in
    order; `literals` holds literals captured with `literals="any"`, keyed
    "node_name.arg_path". After `replace`, `replacements` holds the values that now stand
    for the outputs.
    """

    pattern: Pattern
    nodes: dict[fx.Node, fx.Node]
    bindings: dict[str, Any]
    outputs: tuple[fx.Node, ...]
    literals: dict[str, Any] = field(default_factory=dict)
    replacements: tuple[Any, ...] = ()
    dead_users: tuple[fx.Node, ...] = ()  # unread, effect-free users erased with the match

    @property
    def anchor(self) -> fx.Node:
        """The graph node matched by the pattern's anchor output."""
        return self.nodes[self.pattern.anchor]

    def graph_nodes(self) -> list[fx.Node]:
        """The matched graph nodes, in pattern order."""
        return [self.nodes[p] for p in self.pattern.nodes]

    def __str__(self) -> str:
        bound = ", ".join(
            f"{k}={v.name if isinstance(v, fx.Node) else v!r}" for k, v in self.bindings.items()
        )
        names = ", ".join(n.name for n in self.graph_nodes())
        return f"Match({self.pattern.name}: [{names}] with {bound})"

    __repr__ = __str__


class GraphIndex:
    """Per-graph facts the walk reuses across patterns: order, op keys, normalized args."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.order = list(graph.nodes)
        self.position: dict[fx.Node, float] = {n: float(i) for i, n in enumerate(self.order)}
        self.keys: dict[fx.Node, Hashable] = {n: op_key(n) for n in self.order}
        self._args: dict[fx.Node, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self._has_mutation: bool | None = None

    def args(self, node: fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
        found = self._args.get(node)
        if found is None:
            found = self._args[node] = normalized_args(node)
        return found

    def has_mutation(self) -> bool:
        """Whether any node writes into an input (computed once, on first need)."""
        if self._has_mutation is None:
            cache: dict[Any, Any] = {}
            self._has_mutation = any(effects_of(n, cache).mutates for n in self.order)
        return self._has_mutation


class _State:
    """A partial match; copied to backtrack."""

    __slots__ = ("nodes", "used", "bound", "literals")

    def __init__(self) -> None:
        self.nodes: dict[fx.Node, fx.Node] = {}
        self.used: dict[fx.Node, fx.Node] = {}
        self.bound: dict[fx.Node, Any] = {}
        self.literals: dict[str, Any] = {}

    def copy(self) -> _State:
        other = _State()
        other.nodes, other.used = dict(self.nodes), dict(self.used)
        other.bound, other.literals = dict(self.bound), dict(self.literals)
        return other


class _Matcher:
    """Structural matching of one pattern against one graph index."""

    def __init__(self, pattern: Pattern, index: GraphIndex) -> None:
        self.pattern = pattern
        self.index = index

    def node(self, p: fx.Node, g: fx.Node, state: _State) -> bool:
        if p in state.nodes:
            return state.nodes[p] is g
        if g in state.used or self.index.keys.get(g) != self.pattern.keys[p]:
            return False
        key = self.pattern.keys[p]
        if key == RESHAPE_KEY and not self._aliasing_compatible(p, g):
            return False
        if key == GET_ATTR_KEY:
            return self._constant(p, g, state)
        state.nodes[p], state.used[g] = g, p
        p_args, p_kwargs = self.pattern.args[p]
        g_args, g_kwargs = self.index.args(g)
        if len(p_args) != len(g_args) or p_kwargs.keys() != g_kwargs.keys():
            return False
        for position, (pv, gv) in enumerate(zip(p_args, g_args)):
            if not self.value(pv, gv, state, f"{p.name}.{position}"):
                return False
        return all(
            self.value(pv, g_kwargs[k], state, f"{p.name}.{k}") for k, pv in p_kwargs.items()
        )

    def value(self, pv: Any, gv: Any, state: _State, where: str) -> bool:
        if isinstance(pv, fx.Node):
            if pv.op == "placeholder":
                return self._bind(pv, gv, state)
            return isinstance(gv, fx.Node) and self.node(pv, gv, state)
        if isinstance(pv, (list, tuple)):
            return (
                isinstance(gv, (list, tuple))
                and len(pv) == len(gv)
                and all(self.value(a, b, state, f"{where}.{i}") for i, (a, b) in enumerate(zip(pv, gv)))
            )
        if isinstance(pv, dict):
            return (
                isinstance(gv, dict)
                and pv.keys() == gv.keys()
                and all(self.value(pv[k], gv[k], state, f"{where}.{k}") for k in pv)
            )
        if self.pattern.literals == "any" and _is_scalar_like(gv):
            state.literals[where] = gv
            return True
        return literal_equal(pv, gv)

    def _bind(self, placeholder: fx.Node, value: Any, state: _State) -> bool:
        if placeholder in state.bound:
            return _same(state.bound[placeholder], value)
        if placeholder in self.pattern.tensor_inputs and not _may_be_tensor(value):
            return False
        state.bound[placeholder] = value
        return True

    def _constant(self, p: fx.Node, g: fx.Node, state: _State) -> bool:
        owner = g.graph.owning_module
        if owner is None:
            return False
        try:
            value = _fetch(owner, str(g.target))
        except AttributeError:
            return False
        if not literal_equal(self.pattern.constants[p], value):
            return False
        state.nodes[p], state.used[g] = g, p
        return True

    def _aliasing_compatible(self, p: fx.Node, g: fx.Node) -> bool:
        p_kind, g_kind = reshape_kind(p), reshape_kind(g)
        if p_kind == g_kind or "reshape" not in (p_kind, g_kind):
            return True  # view and _unsafe_view compute the same values with no copy choice
        # reshape may copy where view aliases: equal values, but a write through one would
        # not reach the other. Sound only in a graph that writes into nothing.
        return not self.index.has_mutation()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return a is b
    return literal_equal(a, b)


def _may_be_tensor(value: Any) -> bool:
    if not isinstance(value, fx.Node):
        return False
    val = node_value(value)
    return val is None or isinstance(val, torch.Tensor)


def _is_scalar_like(value: Any) -> bool:
    """A literal, or a node computing a symbolic scalar (never a tensor)."""
    if isinstance(value, fx.Node):
        val = node_value(value)
        return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))
    if isinstance(value, (list, tuple)):
        return all(_is_scalar_like(v) for v in value)
    return not isinstance(value, torch.Tensor)


def find_match(pattern: Pattern, index: GraphIndex, anchor: fx.Node) -> Match | None:
    """The match of `pattern` whose anchor is `anchor`, or None."""
    if pattern.anchor_arg_keys:
        args = index.args(anchor)[0]
        keys = index.keys
        for position, key in pattern.anchor_arg_keys:
            if position >= len(args) or keys.get(args[position]) != key:
                return None
    matcher = _Matcher(pattern, index)
    start = _State()
    if not matcher.node(pattern.anchor, anchor, start):
        return None
    for state in _complete(matcher, start):
        found = _accept(pattern, index, state)
        if found is not None:
            return found
    return None


def _complete(matcher: _Matcher, state: _State) -> Iterable[_State]:
    """Every way of extending `state` to all pattern nodes (depth-first, in graph order)."""
    pattern, index = matcher.pattern, matcher.index
    todo = [p for p in pattern.nodes if p not in state.nodes]
    if not todo:
        yield state
        return
    node, known = _next_to_expand(todo, state)
    if known is None:
        candidates = [g for g in index.order if index.keys[g] == pattern.keys[node]]
    else:
        candidates = sorted(known.users, key=index.position.__getitem__)
    for candidate in candidates:
        trial = state.copy()
        if matcher.node(node, candidate, trial):
            yield from _complete(matcher, trial)


def _next_to_expand(todo: list[fx.Node], state: _State) -> tuple[fx.Node, fx.Node | None]:
    """An unmatched pattern node with an input already matched (and that input's graph
    node), or the first unmatched node (None: search the whole graph)."""
    for p in todo:
        for source in p.all_input_nodes:
            if source in state.nodes:
                return p, state.nodes[source]
            bound = state.bound.get(source)
            if isinstance(bound, fx.Node):
                return p, bound
    return todo[0], None


def _accept(pattern: Pattern, index: GraphIndex, state: _State) -> Match | None:
    matched = state.used
    if any(isinstance(v, fx.Node) and v in matched for v in state.bound.values()):
        return None  # a placeholder bound to a node of the match itself
    outputs = {state.nodes[p] for p in pattern.outputs}
    dead: dict[fx.Node, None] = {}
    for g in matched:
        if g in outputs:
            continue
        for user in g.users:
            if user in matched:
                continue
            if not is_dead(user):
                return None  # an intermediate value escapes
            dead[user] = None
    if len(pattern.outputs) > 1 and not is_convex(index, matched, state.bound.values()):
        return None
    found = Match(
        pattern=pattern,
        nodes=dict(state.nodes),
        bindings={p.name: v for p, v in state.bound.items()},
        outputs=tuple(state.nodes[p] for p in pattern.outputs),
        literals=dict(state.literals),
        dead_users=tuple(dead),
    )
    if pattern.check is not None and not pattern.check(found):
        return None
    return found


def is_dead(node: fx.Node) -> bool:
    """A node nobody reads and that has no effect (make_fx leaves `detach` nodes like that):
    it observes nothing, so it does not count as an escape."""
    return not node.users and node.op in ("call_function", "call_method") and not effects_of(
        node
    ).barrier and not effects_of(node).random


def is_convex(index: GraphIndex, matched: Iterable[fx.Node], inputs: Iterable[Any]) -> bool:
    """True when no node in `inputs` depends on a node in `matched`."""
    return not descendants_before(index, set(matched), inputs)[1]


def descendants_before(
    index: GraphIndex, matched: set[fx.Node], inputs: Iterable[Any]
) -> tuple[list[fx.Node], bool]:
    """Nodes after the first matched node and up to the last input that depend on the match
    (in order), and whether an input is among them."""
    sources = [v for v in inputs if isinstance(v, fx.Node)]
    if not sources:
        return [], False
    position = index.position
    last = max(sources, key=position.__getitem__)
    first = min(matched, key=position.__getitem__)
    if position[last] < position[first]:
        return [], False
    reached, moved = set(matched), []
    node = first.next
    while True:
        if node not in matched and any(i in reached for i in node.all_input_nodes):
            reached.add(node)
            moved.append(node)
        if node is last:
            break
        node = node.next
    return moved, any(s in reached for s in sources)


def walk(patterns: list[Pattern], index: GraphIndex) -> list[Match]:
    """Non-overlapping matches of `patterns` in one walk over the graph (see module doc)."""
    by_key: dict[Hashable, list[Pattern]] = defaultdict(list)
    for pattern in patterns:
        by_key[pattern.anchor_key].append(pattern)
    taken: set[fx.Node] = set()
    matches: list[Match] = []
    # Walk from the end: a pattern's anchor (an output) comes after its other nodes, so a
    # large pattern claims its nodes before a smaller one anchored inside it can.
    for node in reversed(index.order):
        candidates = by_key.get(index.keys[node])
        if not candidates or node in taken:
            continue
        for pattern in candidates:
            found = find_match(pattern, index, node)
            if found is None:
                continue
            claimed = (*found.nodes.values(), *found.dead_users)
            if any(g in taken for g in claimed):
                continue
            taken.update(claimed)
            matches.append(found)
            break
    matches.reverse()
    logger.debug("%d matches of %d patterns", len(matches), len(patterns))
    return matches
