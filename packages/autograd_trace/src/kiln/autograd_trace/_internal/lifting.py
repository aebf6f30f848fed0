"""Lifting a graph's parameters, buffers and tensor constants into inputs, and back.

``make_fx`` under a fake mode cannot touch real tensors, so every tensor the input graph reads
through ``get_attr`` or through a ``call_module`` submodule is traced as an extra fake input.
In the traced graph those extra placeholders become ``get_attr`` nodes again, holding the very
same tensor objects, so the caller sees the calling convention of the input graph. Buffer
mutations turn into ``copy_`` write-backs into the ``get_attr`` node, i.e. into the real buffer.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

from .meta import VAL

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class LiftedTensor:
    """One tensor read by the graph; ``names`` are all qualified names it is reachable by."""

    names: tuple[str, ...]
    value: torch.Tensor
    fake: torch.Tensor

    def __str__(self) -> str:
        return f"LiftedTensor({', '.join(self.names)}: {tuple(self.value.shape)})"


def collect_lifted_tensors(gm: torch.nn.Module, fake_mode: FakeTensorMode) -> list[LiftedTensor]:
    """Parameters, buffers and get_attr tensor constants of ``gm``, one entry per tensor object.

    ``gm`` is usually a GraphModule; for any other ``nn.Module`` only its parameters and
    buffers are collected.
    """
    names_by_id: dict[int, list[str]] = {}
    tensor_by_id: dict[int, torch.Tensor] = {}

    def add(name: str, tensor: torch.Tensor) -> None:
        names = names_by_id.setdefault(id(tensor), [])
        tensor_by_id[id(tensor)] = tensor
        if name not in names:
            names.append(name)

    for name, parameter in gm.named_parameters(remove_duplicate=False):
        add(name, parameter)
    for name, buffer in gm.named_buffers(remove_duplicate=False):
        add(name, buffer)
    for node in gm.graph.nodes if isinstance(gm, torch.fx.GraphModule) else ():
        if node.op == "get_attr":
            value = fetch_attr(gm, node.target)
            if isinstance(value, torch.Tensor):
                add(node.target, value)
    return [
        LiftedTensor(
            names=tuple(names_by_id[key]),
            value=tensor_by_id[key],
            fake=fake_mode.from_tensor(tensor_by_id[key], static_shapes=True),
        )
        for key in names_by_id
    ]


def fetch_attr(module: torch.nn.Module, qualified_name: str) -> object:
    value: object = module
    for part in qualified_name.split("."):
        value = getattr(value, part)
    return value


def restore_lifted_tensors(
    traced: torch.fx.GraphModule, lifted: Sequence[LiftedTensor], num_user_inputs: int
) -> torch.fx.GraphModule:
    """Turn the trailing lifted placeholders of ``traced`` back into get_attr nodes.

    Returns a new GraphModule owning the traced constants and the lifted tensors (shared with
    the input graph, not copied); unused lifted tensors are dropped.
    """
    graph = traced.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    lifted_placeholders = placeholders[num_user_inputs:]
    if len(lifted_placeholders) != len(lifted):
        raise AssertionError(
            f"expected {len(lifted)} lifted placeholders, found {len(lifted_placeholders)}"
        )
    attrs = {n.target: fetch_attr(traced, n.target) for n in graph.nodes if n.op == "get_attr"}
    traced_targets = set(attrs)
    for placeholder, tensor in zip(lifted_placeholders, lifted):
        if not placeholder.users:
            graph.erase_node(placeholder)
            continue
        target = _free_attr_name(tensor.names[0], traced_targets)
        attrs[target] = tensor.value
        with graph.inserting_before(placeholder):
            # create_node, not graph.get_attr: the attribute lives on the module built below.
            get_attr = graph.create_node("get_attr", target)
        get_attr.meta[VAL] = placeholder.meta.get(VAL, tensor.fake)
        placeholder.replace_all_uses_with(get_attr)
        graph.erase_node(placeholder)
    root = torch.nn.Module()
    for target, value in attrs.items():
        _install_attr(root, target, value)
    return torch.fx.GraphModule(root, graph)


def add_constant_vals(gm: torch.fx.GraphModule, fake_mode: FakeTensorMode) -> None:
    """Give get_attr nodes of tensor constants made during tracing their ``meta["val"]``."""
    for node in gm.graph.nodes:
        if node.op == "get_attr" and VAL not in node.meta:
            value = fetch_attr(gm, node.target)
            if isinstance(value, torch.Tensor):
                node.meta[VAL] = fake_mode.from_tensor(value, static_shapes=True)


def _free_attr_name(name: str, traced_targets: set[str]) -> str:
    """``name``, renamed only if it clashes with a constant that tracing itself created."""

    def clashes(candidate: str) -> bool:
        return any(
            candidate == target
            or target.startswith(candidate + ".")
            or candidate.startswith(target + ".")
            for target in traced_targets
        )

    candidate, suffix = name, 0
    while clashes(candidate):
        suffix += 1
        candidate = f"{name.replace('.', '_')}_lifted{suffix}"
    return candidate


def _install_attr(root: torch.nn.Module, qualified_name: str, value: object) -> None:
    *path, field = qualified_name.split(".")
    module = root
    for part in path:
        child = getattr(module, part, None)
        if child is None:
            child = torch.nn.Module()
            module.add_module(part, child)
        module = child
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        module.register_buffer(field, value)
    else:
        setattr(module, field, value)
