"""Passes over a kernel graph's module that cut the Python work of each of its calls.

A compiled graph runs its module's generated Python on every call: on small graphs and on GPUs
(where kernels are launched asynchronously) that host time is the call's cost. These passes
keep every check and copy the module makes, and make fewer Python calls to do them:

- `check_input_layouts_at_once`: the layout checks of the graph's inputs whose strides are known
  numbers (`ensure_layout`, one call per input) become one `ensure_layouts` call;
- `drop_unused_views`: a view the module makes and never reads (left by output rewrites) goes;
- `share_private_outputs`: an output no user sees stays a view of its buffer, not a copy.
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


def share_private_outputs(gm: fx.GraphModule, private: tuple[int, ...]) -> None:
    """Each output at a `private` position that is a `copied_view` of a buffer becomes a view
    of it (`strided_view`) when no other output outside `private` shares that buffer without a
    copy: the copy was made so that a user could modify the output in place, and none sees it."""
    if not private:
        return
    output = gm.graph.output_node()
    values = output.args[0]
    flat = list(values) if isinstance(values, (tuple, list)) else [values]
    shared = {_buffer(v) for position, v in enumerate(flat) if position not in private
              and isinstance(v, fx.Node) and v.target is not copied_view}
    changed = False
    for position in private:
        value = flat[position] if position < len(flat) else None
        if isinstance(value, fx.Node) and value.target is copied_view and value.args[0] not in shared:
            with gm.graph.inserting_before(value):
                view = gm.graph.call_function(strided_view, value.args)
            value.replace_all_uses_with(view)
            gm.graph.erase_node(value)
            changed = True
    if changed:
        gm.graph.lint()
        gm.recompile()


def _buffer(node: fx.Node) -> fx.Node:
    """The buffer an output node views (itself when it is no view)."""
    return node.args[0] if node.target in _VIEWS else node
