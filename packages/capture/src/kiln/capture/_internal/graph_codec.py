"""A ``GraphModule`` as JSON data plus tensors: its nodes, attributes and metadata.

The graph is stored as its structure, node by node (name, op, target, arguments, type
annotation, ``node.meta``), never as generated Python source. Parameters, buffers and tensor
constants are stored as tensors by attribute path; graph-valued attributes (the bodies of
higher-order operators such as ``torch.cond``) are stored as nested graphs. ``node.meta``
values that are not data (Dynamo's ``grapharg`` objects, ...) are dropped and counted.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch

from kiln.capture._internal.refs import RefError, encode_ref
from kiln.capture._internal.values import UnsavableValue, ValueDecoder, ValueEncoder

log = logging.getLogger(__name__)

_VALUE_META_KEYS = ("val", "example_value")


class GraphFileError(ValueError):
    """A graph that cannot be saved, or a file that cannot be loaded; says why and what to do."""


def encode_graph_module(
    gm: torch.fx.GraphModule, encoder: ValueEncoder, dropped: Counter[str]
) -> dict[str, Any]:
    """JSON data for ``gm``; real tensors go to ``encoder.tensors``, dropped meta keys to
    ``dropped``. Raises ``GraphFileError`` naming the node that cannot be saved."""
    codegen = type(gm.graph._codegen)
    if codegen is not torch.fx.graph.CodeGen:
        raise GraphFileError(
            f"the graph uses the {codegen.__name__} calling convention; save handles graphs "
            "with flat positional inputs (as Dynamo and kiln.capture's export mode build them)"
        )
    return {
        "class_name": type(gm).__name__,
        "nodes": [_encode_node(node, encoder, dropped) for node in gm.graph.nodes],
        "attributes": _encode_attributes(gm, encoder, dropped),
        "meta": _encode_meta(gm.meta, encoder, dropped, owner="the graph module"),
    }


def decode_graph_module(data: dict[str, Any], decoder: ValueDecoder) -> torch.fx.GraphModule:
    """Rebuild the ``GraphModule`` that ``encode_graph_module`` encoded."""
    graph = torch.fx.Graph()
    nodes: dict[str, torch.fx.Node] = {}
    for entry in data["nodes"]:
        try:
            node = _decode_node(graph, entry, nodes, decoder)
        except (RefError, KeyError, ValueError, TypeError) as error:
            raise GraphFileError(f"cannot load node {entry.get('name')!r}: {error}") from error
        nodes[node.name] = node
    graph.lint()
    root = torch.nn.Module()
    attributes = {path: _decode_attribute(a, decoder) for path, a in data["attributes"].items()}
    for path, value in attributes.items():
        _install(root, path, value)
    gm = torch.fx.GraphModule(root, graph, class_name=data["class_name"])
    for path, value in attributes.items():
        if not _has_attribute(gm, path):  # GraphModule copies only what the graph uses
            _install(gm, path, value)
    gm.meta.update(decoder.decode(data["meta"], {}, strict=False))
    return gm


def _encode_node(node: torch.fx.Node, encoder: ValueEncoder, dropped: Counter[str]) -> dict:
    try:
        target = node.target if isinstance(node.target, str) else encode_ref(node.target)
        args, kwargs = encoder.encode(node.args), encoder.encode(node.kwargs)
    except (RefError, UnsavableValue) as error:
        raise GraphFileError(
            f"cannot save node {node.name!r} ({node.format_node()}): {error}"
        ) from error
    if node.op == "call_module":
        module = node.graph.owning_module.get_submodule(str(node.target))
        if not isinstance(module, torch.fx.GraphModule):
            raise GraphFileError(
                f"cannot save node {node.name!r}: it calls the {type(module).__name__} module "
                f"{node.target!r}, and a file holds tensors and graphs, not module classes; "
                "capture with Dynamo's default inline_inbuilt_nn_modules=True, which makes "
                "module parameters graph inputs"
            )
    return {
        "name": node.name,
        "op": node.op,
        "target": target,
        "args": args,
        "kwargs": kwargs,
        "type": _encode_type(node.type),
        "meta": _encode_meta(node.meta, encoder, dropped, owner=f"node {node.name!r}"),
    }


def _encode_type(annotation: Any) -> Any:
    if annotation is None:
        return None
    try:
        return encode_ref(annotation)
    except RefError:
        log.debug("type annotation %r is not saved", annotation)
        return None


def _encode_meta(meta: dict, encoder: ValueEncoder, dropped: Counter[str], owner: str) -> Any:
    kept = []
    for key, value in meta.items():
        try:
            kept.append([encoder.encode(key), encoder.encode(value)])
        except (UnsavableValue, RefError) as error:
            dropped[str(key)] += 1
            log_fn = log.warning if key in _VALUE_META_KEYS else log.debug
            log_fn("meta[%r] of %s is not saved: %s", key, owner, error)
    return {"$": "dict", "items": kept}


def _decode_node(
    graph: torch.fx.Graph, entry: dict, nodes: dict[str, torch.fx.Node], decoder: ValueDecoder
) -> torch.fx.Node:
    target = entry["target"]
    if not isinstance(target, str):
        target = decoder.decode(target, nodes, strict=True)
    type_expr = None
    if entry["type"] is not None:
        type_expr = decoder.decode(entry["type"], nodes, strict=False)
        type_expr = type_expr if not isinstance(type_expr, str) else None
    node = graph.create_node(
        entry["op"],
        target,
        tuple(decoder.decode(entry["args"], nodes, strict=True)),
        dict(decoder.decode(entry["kwargs"], nodes, strict=True)),
        name=entry["name"],
        type_expr=type_expr,
    )
    if node.name != entry["name"]:
        raise GraphFileError(f"node {entry['name']!r} was renamed {node.name!r} on load")
    node.meta = decoder.decode(entry["meta"], nodes, strict=False)
    return node


def _encode_attributes(
    gm: torch.fx.GraphModule, encoder: ValueEncoder, dropped: Counter[str]
) -> dict[str, dict]:
    attributes: dict[str, dict] = {}
    _walk_module(gm, "", attributes, encoder, dropped)
    for node in gm.graph.nodes:
        if node.op != "get_attr" or node.target in attributes:
            continue
        value = _fetch(gm, str(node.target))
        if isinstance(value, torch.Tensor):
            attributes[node.target] = {"kind": "tensor", "tensor": encoder.tensor_key(value)}
        elif not isinstance(value, torch.nn.Module):
            try:
                attributes[node.target] = {"kind": "value", "value": encoder.encode(value)}
            except UnsavableValue as error:
                raise GraphFileError(
                    f"cannot save attribute {node.target!r} read by node {node.name!r}: {error}"
                ) from error
    return attributes


def _walk_module(
    module: torch.nn.Module,
    prefix: str,
    attributes: dict[str, dict],
    encoder: ValueEncoder,
    dropped: Counter[str],
) -> None:
    for name, parameter in module._parameters.items():
        if parameter is not None:
            attributes[prefix + name] = {
                "kind": "parameter",
                "tensor": encoder.tensor_key(parameter),
            }
    for name, buffer in module._buffers.items():
        if buffer is not None:
            persistent = name not in module._non_persistent_buffers_set
            attributes[prefix + name] = {
                "kind": "buffer",
                "tensor": encoder.tensor_key(buffer),
                "persistent": persistent,
            }
    for name, child in module._modules.items():
        if isinstance(child, torch.fx.GraphModule):
            graph = encode_graph_module(child, encoder, dropped)
            attributes[prefix + name] = {"kind": "graph", "graph": graph}
        elif child is not None:
            _walk_module(child, f"{prefix}{name}.", attributes, encoder, dropped)


def _decode_attribute(attribute: dict, decoder: ValueDecoder) -> Any:
    kind = attribute["kind"]
    if kind == "graph":
        return decode_graph_module(attribute["graph"], decoder)
    if kind == "value":
        return decoder.decode(attribute["value"], {}, strict=True)
    tensor = decoder.tensors[attribute["tensor"]]
    if kind == "parameter" and not isinstance(tensor, torch.nn.Parameter):
        tensor = torch.nn.Parameter(tensor, requires_grad=tensor.requires_grad)
    if kind == "buffer":
        return _Buffer(tensor, attribute.get("persistent", True))
    return tensor


class _Buffer:
    """A tensor to register as a buffer (and whether it is persistent)."""

    def __init__(self, tensor: torch.Tensor, persistent: bool) -> None:
        self.tensor, self.persistent = tensor, persistent


def _install(root: torch.nn.Module, path: str, value: Any) -> None:
    *parents, name = path.split(".")
    module = root
    for part in parents:
        child = getattr(module, part, None)
        if child is None:
            child = torch.nn.Module()
            module.add_module(part, child)
        module = child
    if isinstance(value, _Buffer):
        module.register_buffer(name, value.tensor, persistent=value.persistent)
    elif isinstance(value, torch.nn.Parameter):
        module.register_parameter(name, value)
    elif isinstance(value, torch.nn.Module):
        module.add_module(name, value)
    else:
        setattr(module, name, value)


def _fetch(root: torch.nn.Module, path: str) -> Any:
    value: Any = root
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _has_attribute(root: torch.nn.Module, path: str) -> bool:
    try:
        _fetch(root, path)
    except AttributeError:
        return False
    return True
