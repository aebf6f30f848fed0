"""Passes over a kernel graph's module that cut the Python work of each of its calls.

A compiled graph runs its module's generated Python on every call: on small graphs and on GPUs
(where kernels are launched asynchronously) that host time is the call's cost. These passes
keep every check and copy the module makes, and make fewer Python calls to do them:

- `check_input_layouts_at_once`: the layout checks of the graph's inputs whose strides are known
  numbers (`ensure_layout`, one call per input) become one `ensure_layouts` call;
- `drop_unused_views`: a view the module makes and never reads (left by output rewrites) goes.
"""

from __future__ import annotations

import operator

import torch.fx as fx

from .graph_runtime import (
    copied_view,
    ensure_layout,
    ensure_layouts,
    internal_view,
    restrided_buffer,
    strided_view,
)

_VIEWS = (strided_view, internal_view, restrided_buffer, copied_view)


def check_input_layouts_at_once(graph: fx.Graph) -> bool:
    """Replace the `ensure_layout` calls of placeholders with constant strides by one
    `ensure_layouts` call after the last placeholder. Returns whether it changed `graph`."""
    checks = [n for n in graph.nodes if n.op == "call_function" and n.target is ensure_layout
              and n.args[0].op == "placeholder" and all(isinstance(s, int) for s in n.args[1])]
    if len(checks) < 2:
        return False
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    tensors = tuple(n.args[0] for n in checks)
    strides = tuple(tuple(n.args[1]) for n in checks)
    with graph.inserting_after(placeholders[-1]):
        checked = graph.call_function(ensure_layouts, (tensors, strides))
    with graph.inserting_after(checked):
        for position, check in enumerate(checks):
            item = graph.call_function(operator.getitem, (checked, position))
            check.replace_all_uses_with(item)
            graph.erase_node(check)
    return True


def drop_unused_views(graph: fx.Graph) -> bool:
    """Erase views nothing reads. Returns whether it changed `graph`."""
    unused = [n for n in graph.nodes if n.op == "call_function" and n.target in _VIEWS and not n.users]
    for node in reversed(unused):
        graph.erase_node(node)
    return bool(unused)


def fewer_calls(gm: fx.GraphModule) -> None:
    """Both passes on `gm`, in place (recompiled if changed)."""
    changed = drop_unused_views(gm.graph)
    changed = check_input_layouts_at_once(gm.graph) or changed
    if changed:
        gm.graph.lint()
        gm.recompile()
