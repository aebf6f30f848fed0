"""One Python function per compiled graph: region modules inlined into the graph calling them.

The partitioned graph calls each compiled region (a GraphModule built by a codegen) through
`call_module`; every such call costs an `nn.Module.__call__`, a GraphModule wrapper and a
Dynamo-disabled frame: microseconds per region per call, which small graphs notice. Copying
each region's nodes into the caller leaves one FX-generated function that calls kernels,
externs and fallback ops directly.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import torch
import torch.fx as fx


def inline_regions(gm: fx.GraphModule) -> fx.GraphModule:
    """Inline every `call_module` of a GraphModule into `gm` (in place; returns `gm`).

    A call stays as it is when its module is not a GraphModule, takes keyword arguments, or
    returns a structure whose parts the caller does not read with constant `getitem`s.
    """
    names = itertools.count()
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_module":
            continue
        sub = gm.get_submodule(node.target)
        if not isinstance(sub, fx.GraphModule) or not _inlinable(node, sub):
            continue
        _inline(gm, node, sub, names)
        changed = True
    if changed:
        gm.delete_all_unused_submodules()
        gm.graph.lint()
        gm.recompile()
    return gm


def _inlinable(node: fx.Node, sub: fx.GraphModule) -> bool:
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if node.kwargs or len(placeholders) != len(node.args):
        return False
    output = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    if isinstance(output, fx.Node):
        return True
    if not isinstance(output, (tuple, list)):
        return False
    for user in node.users:
        if user.op != "call_function" or user.target is not operator.getitem:
            return False
        position = user.args[1]
        if not isinstance(position, int) or not isinstance(output[position], fx.Node):
            return False
    return True


def _inline(gm: fx.GraphModule, node: fx.Node, sub: fx.GraphModule, names: itertools.count) -> None:
    graph = gm.graph
    env: dict[fx.Node, Any] = {}
    args = iter(node.args)
    output: Any = None
    with graph.inserting_before(node):
        for inner in sub.graph.nodes:
            if inner.op == "placeholder":
                env[inner] = next(args)
            elif inner.op == "output":
                output = inner.args[0]
            elif inner.op in ("get_attr", "call_module"):
                # The same object under a fresh name in `gm` (parameters stay shared, not copied).
                name = f"{node.target}_{inner.target}".replace(".", "_") + f"_{next(names)}"
                setattr(gm, name, _attribute(sub, inner.target))
                moved = graph.create_node(inner.op, name, fx.map_arg(inner.args, env.__getitem__),
                                          fx.map_arg(inner.kwargs, env.__getitem__), inner.name)
                moved.meta = dict(inner.meta)
                env[inner] = moved
            else:
                env[inner] = graph.node_copy(inner, env.__getitem__)
    if isinstance(output, fx.Node):
        node.replace_all_uses_with(env[output])
    else:
        for user in list(node.users):
            user.replace_all_uses_with(env[output[user.args[1]]])
            graph.erase_node(user)
    graph.erase_node(node)


def _attribute(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value
