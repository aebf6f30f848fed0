"""Outputs that eager returns as views of a mutated input are views of that input.

``x.relu_(); return x.t()`` returns, in eager, a view of ``x``. Functionalization (inference
tracing) computes ``relu(x)``, writes it back with ``copy_(x, relu)`` and returns ``t(relu)``:
the right values, but another tensor, laid out as ``relu`` is (not always as ``x``). Here the
output's chain of view ops is replayed on the write-back (``copy_`` returns ``x`` itself), so the
output is eager's view of the input: same strides, same storage. The write-back of ``x`` itself
(no view) is `autograd_trace`'s (`trace_inference` returns the ``copy_``).

Training graphs need nothing: `autograd_trace`'s runtime rebuilds views of inputs with
``as_strided`` on the input.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten


def view_mutated_inputs(aten_graph: fx.GraphModule) -> bool:
    """Rewrite `aten_graph`'s outputs that view the value written back into an input into views
    of the write-back (see the module docstring). Returns whether it changed the graph."""
    graph = aten_graph.graph
    writebacks: dict[fx.Node, fx.Node] = {}  # the value written back -> the last copy_ writing it
    for node in graph.nodes:
        if node.op == "call_function" and node.target is aten.copy_.default and node.args[0].op == "placeholder":
            writebacks = {v: c for v, c in writebacks.items() if c.args[0] is not node.args[0]}
            writebacks[node.args[1]] = node
    if not writebacks:
        return False
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    replayed: dict[fx.Node, fx.Node] = {}

    def rebased(value: Any) -> Any:
        if not isinstance(value, fx.Node):
            return value
        chain = _view_chain(value)
        if not chain or chain[0].args[0] not in writebacks:
            return value
        source = writebacks[chain[0].args[0]]
        with graph.inserting_before(output):
            for view in chain:
                if view not in replayed:
                    replayed[view] = _replay(graph, view, source)
                source = replayed[view]
        return source

    outputs = fx.node.map_aggregate(output.args[0], rebased)
    if not replayed:
        return False
    output.args = (outputs,)
    for view in reversed(list(replayed)):  # the functional chains, unless something else reads them
        if not view.users:
            graph.erase_node(view)
    aten_graph.recompile()
    return True


def _view_chain(node: fx.Node) -> list[fx.Node]:
    """The view nodes from the viewed value to `node` (empty when `node` is no view)."""
    chain = []
    while node.op == "call_function" and node.args and isinstance(node.args[0], fx.Node) and (
            _aliases_first_argument(node.target) or
            (node.target is operator.getitem and _aliases_first_argument(node.args[0].target))):
        chain.append(node)
        node = node.args[0]
    return chain[::-1]


def _aliases_first_argument(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.returns or not schema.arguments:
        return False
    returned, argument = schema.returns[0].alias_info, schema.arguments[0].alias_info
    return returned is not None and argument is not None and not returned.is_write and not argument.is_write


def _replay(graph: fx.Graph, view: fx.Node, source: fx.Node) -> fx.Node:
    """`view`'s op applied to `source`, with its FakeTensor: the input's geometry, not the
    functional value's."""
    args = (source, *view.args[1:])
    node = graph.call_function(view.target, args, dict(view.kwargs))
    node.meta = {k: v for k, v in view.meta.items() if k != "val"}
    source_val = source.meta["val"]
    fake_args = fx.node.map_arg(args, lambda n: n.meta["val"])
    fake_kwargs = fx.node.map_arg(dict(view.kwargs), lambda n: n.meta["val"])
    if isinstance(source_val, torch.Tensor):
        with source_val.fake_mode:
            node.meta["val"] = view.target(*fake_args, **fake_kwargs)
    else:  # getitem of a multi-view op's list
        node.meta["val"] = view.target(*fake_args, **fake_kwargs)
    return node
