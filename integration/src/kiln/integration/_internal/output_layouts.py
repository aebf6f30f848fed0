"""Graph outputs keep the layout of the ATen op their decomposition replaced.

loopir stores an output with the strides of its node's FakeTensor (eager's layout). After the
decomp stage that node is the last op of a decomposition, whose layout can differ from the op
it replaced: eager's ``group_norm`` of a channels-last tensor is channels-last, its
decomposition ends in a ``view`` of a contiguous value; eager's ``log_softmax`` of a transposed
tensor is contiguous, the pointwise ops it decomposes into follow their input. The ATen op's
FakeTensor (from its meta function) has eager's strides, so the output node takes it; except
for ops whose meta function lays results out otherwise than eager (`META_LAYOUT_DIFFERS`).

Meta keys written: ``meta["val"]`` of such output nodes (same dtype and sizes, other strides).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.experimental.symbolic_shapes import statically_known_true

from kiln import loopir

aten = torch.ops.aten
# Ops whose meta function is torch's reference implementation, laid out otherwise than eager's
# kernel: `roll`'s is always contiguous, eager's keeps a channels-last input channels-last.
META_LAYOUT_DIFFERS = frozenset({aten.roll.default})


def keep_output_layouts(aten_graph: fx.GraphModule, decomposed: fx.GraphModule, lowerings: Any) -> int:
    """Give each output of `decomposed` (the decomp stage's result for `aten_graph`: the same
    outputs, in order) the FakeTensor of `aten_graph`'s output where only their strides differ
    (along dims longer than 1: a view keeps its fake, which aliases the value it views).
    Outputs of ops loopir calls as externs keep theirs (an extern's layout is what it returns);
    `lowerings` is the lowering table (None: loopir's default). Returns how many changed."""
    before, after = _output_leaves(aten_graph), _output_leaves(decomposed)
    if len(before) != len(after):
        return 0
    table = lowerings if lowerings is not None else loopir.default_lowerings()
    differs = _meta_layout_differs(aten_graph)
    changed = 0
    for source, node in zip(before, after):
        if not isinstance(source, fx.Node) or not isinstance(node, fx.Node) or node.op != "call_function" \
                or (node.target in table and table[node.target].kind == "extern") or source in differs:
            continue
        eager, val = source.meta.get("val"), node.meta.get("val")
        if isinstance(eager, torch.Tensor) and isinstance(val, torch.Tensor) and eager.dtype == val.dtype \
                and eager.device == val.device and _same_sizes(eager.shape, val.shape) \
                and _significant_strides(eager) != _significant_strides(val):
            node.meta["val"] = eager
            changed += 1
    return changed


def _meta_layout_differs(graph_module: fx.GraphModule) -> set[fx.Node]:
    """Nodes of an op in `META_LAYOUT_DIFFERS` and every node computed from one: their fakes
    follow the meta function's layout (a pointwise op of a channels-last `roll` is contiguous
    there, channels-last in eager), so the decomposed graph's own fakes are the better guess."""
    differs: set[fx.Node] = set()
    for node in graph_module.graph.nodes:
        if node.target in META_LAYOUT_DIFFERS or any(arg in differs for arg in node.all_input_nodes):
            differs.add(node)
    return differs


def _output_leaves(graph_module: fx.GraphModule) -> list[Any]:
    output = next(n for n in reversed(graph_module.graph.nodes) if n.op == "output")
    return pytree.tree_leaves(output.args[0])


def _significant_strides(val: torch.Tensor) -> list[str]:
    """Strides of the dims longer than 1 (a dim of size 1 has any stride), as text."""
    return [str(st) for n, st in zip(val.shape, val.stride()) if str(n) != "1"]


def _same_sizes(eager: Any, decomposed: Any) -> bool:
    """Whether two shapes are equal at every size, without adding shape guards: a view's meta
    may spell a size otherwise (`(s10**2)//s10` for `s10`, group_norm's decomposition)."""
    if _text(eager) == _text(decomposed):
        return True
    return len(eager) == len(decomposed) and all(statically_known_true(a == b) for a, b in zip(eager, decomposed))


def _text(values: Any) -> list[str]:
    """Sizes or strides as text: SymInts compared without adding shape guards."""
    return [str(v) for v in values]
