"""Replacing matches: `replace`, `PatternSet`, and how one match is rewritten.

Matches are found first (one walk, see `matcher`), then rewritten in graph order. A later
match may read the output of an earlier one (back-to-back matches): bindings are resolved
through the values that replaced earlier outputs. Each replacement is inserted just before
the first pattern output (or, for a multi-output pattern whose inputs come later, after
its last input, moving the dependent nodes of the window after it); its outputs take over
every use of the pattern outputs, and the matched nodes are erased.

A replacement function for an ATen pattern is traced with `make_fx` on each match's own
`meta["val"]` values (cached by signature), so shapes baked into the trace are the match's.
For a Torch IR pattern it is traced once with `fx.symbolic_trace`. Graph replacements are
copied as they are. New nodes get the provenance metadata of the nodes they replace (see
`meta.py`) and a `meta["val"]`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from .effects import effects_of
from .matcher import GraphIndex, Match, descendants_before, walk
from .meta import EXAMPLE_VALUE, PATTERN_KEY, PROVENANCE_KEYS, VAL, has_value, node_value
from .pattern import Pattern, PatternSource, _fetch, _flatten, as_pattern, trace_pattern

logger = logging.getLogger(__name__)

ReplacementSource = Callable[..., Any] | fx.Graph | fx.GraphModule


class Replacement:
    """What replaces the matches of one pattern (see the module docstring)."""

    def __init__(self, source: ReplacementSource, pattern: Pattern) -> None:
        self.source = source
        self.pattern = pattern
        self.retrace = False
        self._traced: dict[Any, fx.GraphModule] = {}
        if isinstance(source, (fx.Graph, fx.GraphModule)):
            self.module: fx.GraphModule | None = trace_pattern(source, None)
        elif isinstance(source, torch.nn.Module):
            self.retrace = pattern.ir == "aten"
            self.module = None if self.retrace else fx.symbolic_trace(source)
        elif callable(source):
            # Trace through a wrapper taking exactly the pattern's inputs, so defaulted
            # parameters (`F.silu(input, inplace=False)`) keep their defaults.
            self._check_callable(source)
            self.source = _fixed_arity(source, len(pattern.placeholders))
            self.retrace = pattern.ir == "aten"
            self.module = None if self.retrace else fx.symbolic_trace(self.source)
        else:
            raise TypeError(
                f"replacement for pattern {pattern.name}: expected a function, fx.GraphModule "
                f"or fx.Graph, got {type(source).__name__}"
            )
        if self.module is not None:
            self._check_arity(self.module)

    def _check_callable(self, fn: Callable[..., Any]) -> None:
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            return  # a builtin without a signature: tracing will tell
        arity = len(self.pattern.placeholders)
        try:
            signature.bind(*range(arity))
        except TypeError:
            raise ValueError(
                f"replacement for pattern {self.pattern.name} has signature {signature}, which "
                f"does not take the pattern's {arity} inputs "
                f"({', '.join(p.name for p in self.pattern.placeholders)}) in order"
            ) from None

    def _check_arity(self, module: fx.GraphModule) -> None:
        count = sum(1 for n in module.graph.nodes if n.op == "placeholder")
        if count != len(self.pattern.placeholders):
            raise ValueError(
                f"replacement for pattern {self.pattern.name} takes {count} inputs but the "
                f"pattern has {len(self.pattern.placeholders)} "
                f"({', '.join(p.name for p in self.pattern.placeholders)}); they must agree, "
                "in order"
            )

    def module_for(self, values: list[Any]) -> fx.GraphModule:
        """The replacement graph for a match whose placeholders stand for `values`."""
        if not self.retrace:
            assert self.module is not None
            return self.module
        args = [_trace_value(v, self.pattern.name) for v in values]
        key = _signature(args)
        found = self._traced.get(key) if key is not None else None
        if found is None:
            args = _one_fake_mode(args)
            found = make_fx(
                self.source,
                decomposition_table=self.pattern.decompositions,
                tracing_mode=_tracing_mode(args),
            )(*args)
            self._check_arity(found)
            if key is not None:
                self._traced[key] = found
        return found


def _fixed_arity(fn: Callable[..., Any], arity: int) -> Callable[..., Any]:
    """A plain function of `arity` positional parameters calling `fn` with them."""
    names = ", ".join(f"arg{i}" for i in range(arity))
    namespace: dict[str, Any] = {"replacement": fn}
    exec(f"def call({names}):\n    return replacement({names})\n", namespace)
    call = namespace["call"]
    call.__name__ = getattr(fn, "__name__", "replacement")
    return call


def _trace_value(value: Any, pattern: str) -> Any:
    if not isinstance(value, fx.Node):
        return value
    if not has_value(value):
        raise ValueError(
            f"replace: pattern {pattern} matched, but node {value.name!r} it reads has no "
            "meta['val'] to trace the replacement with; propagate values first (make_fx, "
            "FakeTensorProp) or give the replacement as a graph"
        )
    return node_value(value)


def _one_fake_mode(args: list[Any]) -> list[Any]:
    """`args` with distinct fake tensors, all in one FakeTensorMode.

    make_fx in real mode gives each node's meta["val"] its own mode, and tracing needs one;
    and the same value bound to two placeholders must not be traced as one input (the
    trace would be wrong for matches where they differ, and it is cached).
    """
    fakes = [a for a in args if isinstance(a, FakeTensor)]
    modes = {id(f.fake_mode) for f in fakes}
    if len(modes) <= 1 and len({id(f) for f in fakes}) == len(fakes):
        return args
    if len(modes) == 1:
        mode = fakes[0].fake_mode
    elif _tracing_mode(args) == "symbolic":
        return args  # sizes belong to different ShapeEnvs: nothing sound to rebuild
    else:
        mode = FakeTensorMode()
    with mode:
        return [
            torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            if isinstance(a, FakeTensor)
            else a
            for a in args
        ]


def _tracing_mode(args: list[Any]) -> str:
    fakes = [a for a in args if isinstance(a, FakeTensor)]
    if not fakes:
        return "real"
    symbolic = any(
        isinstance(s, torch.SymInt) for f in fakes for s in (*f.shape, *f.stride())
    ) or any(isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)) for a in args)
    return "symbolic" if symbolic else "fake"


def _signature(args: list[Any]) -> Any:
    key = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if any(isinstance(s, torch.SymInt) for s in (*arg.shape, *arg.stride())):
                return None
            key.append((tuple(arg.shape), arg.stride(), arg.dtype, arg.device, arg.requires_grad))
        else:
            try:
                hash(arg)
            except TypeError:
                return None
            if isinstance(arg, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return None
            key.append((type(arg), arg))
    return tuple(key)


class PatternSet:
    """Patterns (each with an optional replacement) applied together in one walk.

    Entries are `Pattern`s (or anything `Pattern()` accepts, traced as Torch IR) or
    `(pattern, replacement)` pairs; earlier entries win where matches would overlap.
    """

    def __init__(self, entries: Iterable[Any] = ()) -> None:
        self._entries: list[tuple[Pattern, Replacement | None]] = []
        for entry in entries:
            if isinstance(entry, tuple):
                self.add(*entry)
            else:
                self.add(entry)

    def add(
        self, pattern: Pattern | PatternSource, replacement: ReplacementSource | None = None
    ) -> PatternSet:
        """Append a pattern (and what replaces it); returns self."""
        compiled = as_pattern(pattern)
        rule = None if replacement is None else Replacement(replacement, compiled)
        self._entries.append((compiled, rule))
        return self

    @property
    def patterns(self) -> tuple[Pattern, ...]:
        return tuple(p for p, _ in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Pattern]:
        return iter(self.patterns)

    def __add__(self, other: PatternSet) -> PatternSet:
        combined = PatternSet()
        combined._entries = [*self._entries, *other._entries]
        return combined

    def match(self, graph: fx.Graph | fx.GraphModule) -> list[Match]:
        """Non-overlapping matches of every pattern, in graph order of their anchors."""
        return walk(list(self.patterns), GraphIndex(_graph_of(graph)))

    def apply(self, graph: fx.Graph | fx.GraphModule) -> list[Match]:
        """Replace the matches of the patterns that have a replacement, in place.

        Returns the matches rewritten, each with `replacements` set. A GraphModule (or the
        GraphModule owning `graph`) is recompiled once when anything changed.
        """
        target = _graph_of(graph)
        rules = {id(p): r for p, r in reversed(self._entries) if r is not None}
        patterns = [p for p, r in self._entries if r is not None]
        index = GraphIndex(target)
        replaced: dict[fx.Node, Any] = {}
        kept: list[fx.Node] = []  # replaced outputs that the graph's output still reads
        done = []
        try:
            for found in walk(patterns, index):
                rule = rules[id(found.pattern)]
                rewritten = apply_match(target, index, found, rule, replaced, kept)
                if rewritten is not None:
                    done.append(rewritten)
        finally:  # on an error too: leave a consistent graph holding the rewrites made
            _rewire_output(index, replaced, kept)
            owner = target.owning_module
            if done and isinstance(owner, fx.GraphModule) and owner.graph is target:
                owner.recompile()
        logger.debug("replaced %d matches", len(done))
        return done


def match(graph: fx.Graph | fx.GraphModule, pattern: Pattern | PatternSource) -> list[Match]:
    """Non-overlapping occurrences of `pattern` in `graph`, in graph order (deterministic).

    `pattern` is a `Pattern`, or a function / GraphModule / Graph (a function is traced as
    Torch IR; build `Pattern(fn, example_inputs)` for ATen IR).
    """
    return PatternSet([pattern]).match(graph)


def replace(
    graph: fx.Graph | fx.GraphModule,
    pattern: Pattern | PatternSource,
    replacement: ReplacementSource,
) -> list[Match]:
    """Replace every non-overlapping occurrence of `pattern` in `graph` (in place).

    `replacement` is a function or graph taking the pattern's inputs in order and returning
    as many values as the pattern. Returns the rewritten matches (`Match.replacements`).
    """
    return PatternSet([(pattern, replacement)]).apply(graph)


def _graph_of(graph: fx.Graph | fx.GraphModule) -> fx.Graph:
    if isinstance(graph, fx.GraphModule):
        return graph.graph
    if isinstance(graph, fx.Graph):
        return graph
    raise TypeError(f"expected an fx.Graph or fx.GraphModule, got {type(graph).__name__}")


def apply_match(
    graph: fx.Graph,
    index: GraphIndex,
    found: Match,
    rule: Replacement,
    replaced: dict[fx.Node, Any],
    kept: list[fx.Node],
) -> Match | None:
    """Rewrite one match; None when it can no longer be rewritten safely (logged).

    Uses by the graph's output node are left to the caller (`_rewire_output`); outputs that
    only it still reads are appended to `kept` instead of being erased.
    """
    pattern = found.pattern
    values = [
        _resolve(found.bindings[p.name], replaced) if p.name in found.bindings
        else _unbound_value(pattern, i)
        for i, p in enumerate(pattern.placeholders)
    ]
    matched = set(found.nodes.values())
    inputs = [v for v in values if isinstance(v, fx.Node)]
    moved, cyclic = descendants_before(index, matched, inputs)
    if cyclic or any(effects_of(n).barrier for n in moved):
        logger.info("skipping %s: rewriting it would reorder dependent or effectful nodes", found)
        return None
    module = rule.module_for(values)
    position = index.position
    first_output = min(found.outputs, key=position.__getitem__)
    last_input = max(inputs, key=position.__getitem__, default=None)
    if last_input is not None and position[last_input] > position[first_output]:
        # Inputs come after an output: insert after the last input and move the nodes of
        # the window that depend on the match after the replacement.
        new_nodes, results = _insert(graph, module, values, found, before=last_input.next)
        anchor = new_nodes[-1] if new_nodes else last_input
        for node in moved:
            anchor.append(node)
            anchor = node
        _place(index, [*new_nodes, *moved])
    else:
        new_nodes, results = _insert(graph, module, values, found, before=first_output)
        _place(index, new_nodes)
    for old, new in zip(found.outputs, results):
        if not isinstance(new, fx.Node):
            raise ValueError(
                f"replacement for pattern {pattern.name} returns the constant {new!r} for "
                f"output {old.name!r}; replacements must return graph values"
            )
        # The graph's output node is rewired once at the end: rewriting its (possibly very
        # long) argument tuple for every match would be quadratic.
        old.replace_all_uses_with(new, delete_user_cb=lambda user: user.op != "output")
        replaced[old] = new
    for node in found.dead_users:
        graph.erase_node(node)
    for node in sorted(matched, key=position.__getitem__, reverse=True):
        if node.users:  # read by the graph's output node, directly or through kept nodes
            kept.append(node)
        else:
            graph.erase_node(node)
    _propagate_vals(new_nodes)
    return dataclasses.replace(found, replacements=tuple(results))


def _rewire_output(index: GraphIndex, replaced: dict[fx.Node, Any], kept: list[fx.Node]) -> None:
    """Point the output node at the replacements (once, see `apply_match`), then erase the
    matched nodes that only it kept alive (users first)."""
    if not replaced:
        return
    output = next(n for n in reversed(index.graph.nodes) if n.op == "output")
    output.args = fx.map_arg(output.args, lambda n: _resolve(n, replaced))
    for node in sorted(kept, key=index.position.__getitem__, reverse=True):
        index.graph.erase_node(node)


def _resolve(value: Any, replaced: dict[fx.Node, Any]) -> Any:
    while isinstance(value, fx.Node) and value in replaced:
        value = replaced[value]
    return value


def _unbound_value(pattern: Pattern, index: int) -> Any:
    # A placeholder the pattern never reads (make_fx bakes scalar inputs into the graph).
    if pattern.example_inputs is not None and index < len(pattern.example_inputs):
        value = pattern.example_inputs[index]
        if not isinstance(value, torch.Tensor):
            return value
    return None


def _insert(
    graph: fx.Graph,
    module: fx.GraphModule,
    values: list[Any],
    found: Match,
    *,
    before: fx.Node,
) -> tuple[list[fx.Node], list[Any]]:
    """Copy `module`'s graph into `graph`; (new nodes, values standing for the outputs)."""
    env: dict[fx.Node, Any] = {}
    placeholders = iter(values)
    new_nodes: list[fx.Node] = []
    with graph.inserting_before(before):
        for node in module.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "output":
                results = [_lookup(v, env) for v in _flatten(node.args[0])]
            else:
                copied = _copy_node(graph, module, node, env)
                env[node] = copied
                new_nodes.append(copied)
    if len(results) != len(found.outputs):
        raise ValueError(
            f"replacement for pattern {found.pattern.name} returns {len(results)} values; the "
            f"pattern has {len(found.outputs)} outputs"
        )
    _copy_meta(found, new_nodes, results)
    return new_nodes, results


def _lookup(value: Any, env: dict[fx.Node, Any]) -> Any:
    return env[value] if isinstance(value, fx.Node) else value


def _copy_node(
    graph: fx.Graph, module: fx.GraphModule, node: fx.Node, env: dict[fx.Node, Any]
) -> fx.Node:
    if node.op not in ("get_attr", "call_module"):
        return graph.node_copy(node, env.__getitem__)
    owner = graph.owning_module
    if owner is None:
        raise ValueError(
            f"replacement node {node.name!r} ({node.op} {node.target}) needs an attribute, but "
            "the graph being rewritten has no owning module; pass the GraphModule"
        )
    target = _fresh_attribute(owner, str(node.target))
    value = _fetch(module, str(node.target))
    if isinstance(value, torch.nn.Module):
        owner.add_submodule(target, value)
    else:
        setattr(owner, target, value)
    args = fx.map_arg(node.args, env.__getitem__)
    kwargs = fx.map_arg(node.kwargs, env.__getitem__)
    copied = graph.create_node(node.op, target, args, kwargs, name=node.name)
    copied.meta = dict(node.meta)
    return copied


def _fresh_attribute(owner: torch.nn.Module, target: str) -> str:
    base = "_kiln_replacement_" + target.replace(".", "_")
    name, count = base, 0
    while hasattr(owner, name):
        count += 1
        name = f"{base}_{count}"
    return name


def _copy_meta(found: Match, new_nodes: list[fx.Node], results: list[Any]) -> None:
    anchor = found.anchor
    for node in new_nodes:
        for key in PROVENANCE_KEYS:
            if key in anchor.meta:
                node.meta[key] = anchor.meta[key]
        node.meta[PATTERN_KEY] = found.pattern.name
    fresh = set(new_nodes)
    for old, new in zip(found.outputs, results):
        if not isinstance(new, fx.Node) or new not in fresh:
            continue
        for key in PROVENANCE_KEYS:
            if key in old.meta:
                new.meta[key] = old.meta[key]
        for key in (VAL, EXAMPLE_VALUE):
            if key not in new.meta and key in old.meta:
                new.meta[key] = old.meta[key]


def _place(index: GraphIndex, nodes: list[fx.Node]) -> None:
    """Give `nodes` (consecutive in the graph) positions between their neighbours'."""
    if not nodes:
        return
    position = index.position
    low = position.get(nodes[0].prev, -1.0)
    high = position.get(nodes[-1].next, low + 1.0)
    if high - low < 1e-6 * (len(nodes) + 1):
        _renumber(index)
        return
    step = (high - low) / (len(nodes) + 1)
    for i, node in enumerate(nodes, start=1):
        position[node] = low + i * step


def _renumber(index: GraphIndex) -> None:
    index.position.clear()
    index.position.update((n, float(i)) for i, n in enumerate(index.graph.nodes))


def _propagate_vals(nodes: list[fx.Node]) -> None:
    """Fill meta["val"] of new nodes that lack it by running them on fake values."""
    missing = [n for n in nodes if VAL not in n.meta]
    if not missing:
        return
    fake_mode = next(
        (
            v.fake_mode
            for n in nodes
            for i in n.all_input_nodes
            if isinstance(v := node_value(i), FakeTensor)
        ),
        None,
    )
    if fake_mode is None:
        return
    for node in missing:
        try:
            with fake_mode:
                node.meta[VAL] = _run_fake(node)
        except Exception as error:  # propagation is best effort: the graph is still right
            logger.debug("no meta['val'] for %s: %s", node.name, error)


def _run_fake(node: fx.Node) -> Any:
    args = fx.map_arg(node.args, node_value)
    kwargs = fx.map_arg(node.kwargs, node_value)
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    if node.op == "call_module":
        return node.graph.owning_module.get_submodule(str(node.target))(*args, **kwargs)
    if node.op == "get_attr":
        return _fetch(node.graph.owning_module, str(node.target))
    raise ValueError(f"cannot run {node.op}")
