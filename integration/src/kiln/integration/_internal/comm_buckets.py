"""All-reduces of one graph merged into buckets: one collective per bucket, not per tensor.

DDP's python_reducer (``optimize_ddp="python_reducer"`` with compiled autograd) puts one
functional ``all_reduce`` + ``wait_tensor`` per parameter into the backward graph: hundreds of
small collectives, each paying NCCL's launch and latency (HF BERT-base: 404 per step, 86 ms of
NCCL against 2 ms bucketed; BENCHMARKS.md, session 10). The C++ reducer of plain DDP buckets
gradients into about 25 MiB; this pass does the same inside the graph:

    a = all_reduce(x, "sum", g); wa = wait_tensor(a)      flat = cat([x.view(-1), y.view(-1)])
    b = all_reduce(y, "sum", g); wb = wait_tensor(b)  ->  w = wait_tensor(all_reduce(flat, "sum", g))
                                                          wa, wb = split_with_sizes(w).view(...)

An element-wise reduction of a concatenation is the concatenation of the reductions, so values
are unchanged. Every rank compiles the same graph into the same buckets, so the ranks' sequences
of collectives still match. A bucket holds all-reduces of one reduce op, group, dtype and device,
in graph order, up to `BUCKET_BYTES`; a tensor joins it only if it does not depend on a result of
the bucket. The merged collective runs after its last input; what used a member's result (DDP's
copy into ``.grad``) moves after it.
"""

from __future__ import annotations

import dataclasses
import logging
import operator

import torch
import torch.fx as fx

log = logging.getLogger(__name__)

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb

_c10d = getattr(torch.ops, "_c10d_functional", None)
_ALL_REDUCE = getattr(_c10d, "all_reduce", None)
_WAIT = getattr(_c10d, "wait_tensor", None)
aten = torch.ops.aten


@dataclasses.dataclass
class _Bucket:
    key: tuple
    members: list[tuple[fx.Node, fx.Node]] = dataclasses.field(default_factory=list)  # (all_reduce, wait)
    nbytes: int = 0


def _candidate(node: fx.Node) -> tuple[tuple, fx.Node, int] | None:
    """(bucket key, wait node, bytes) of a plain functional all_reduce whose only user is its wait."""
    if node.op != "call_function" or node.target != _ALL_REDUCE.default or node.kwargs:
        return None
    if len(node.users) != 1:
        return None
    wait = next(iter(node.users))
    if wait.target != _WAIT.default:
        return None
    value = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    if not isinstance(value, torch.Tensor) or not all(isinstance(s, int) for s in value.shape):
        return None  # a symbolic size: bucket sizes would have to be symbolic too
    key = (node.args[1], node.args[2], value.dtype, value.device)
    return key, wait, value.numel() * value.element_size()


def _buckets(graph: fx.Graph) -> list[_Bucket]:
    """Buckets in graph order. A tensor that depends on a result of the open bucket (through
    any chain of nodes) closes it: the merged collective could not run before it."""
    open_buckets: dict[tuple, _Bucket] = {}
    done: list[_Bucket] = []
    depends: dict[fx.Node, frozenset[int]] = {}  # ids of open buckets whose results a node reads
    waits: dict[fx.Node, _Bucket] = {}
    for node in graph.nodes:
        found = _candidate(node) if _ALL_REDUCE is not None else None
        if found is not None:
            key, wait, nbytes = found
            bucket = open_buckets.get(key)
            if bucket is None or bucket.nbytes + nbytes > BUCKET_BYTES or id(bucket) in depends[node.args[0]]:
                if bucket is not None:
                    done.append(bucket)
                bucket = open_buckets[key] = _Bucket(key)
            bucket.members.append((node, wait))
            bucket.nbytes += nbytes
            waits[wait] = bucket
        reads = frozenset().union(*(depends[i] for i in node.all_input_nodes))
        depends[node] = reads | {id(waits[node])} if node in waits else reads
    done.extend(open_buckets.values())
    return [b for b in done if len(b.members) > 1]


def _stable_topological_order(graph: fx.Graph) -> None:
    """Reorder `graph` so every node follows its inputs, moving as few nodes as possible: a
    node whose inputs come later (a merged result's users) waits until they are placed."""
    placed: set[fx.Node] = set()
    waiting: dict[fx.Node, list[fx.Node]] = {}  # a missing input -> nodes waiting for it
    order: list[fx.Node] = []
    for first in list(graph.nodes):
        ready = [first]
        while ready:
            node = ready.pop()
            missing = next((i for i in node.all_input_nodes if i not in placed), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(node)
                continue
            placed.add(node)
            order.append(node)
            ready.extend(reversed(waiting.pop(node, [])))
    assert not waiting and order[-1].op == "output", "merging all-reduces left the graph without an order"
    anchor = order[0]
    for node in order[1:]:
        anchor.append(node)
        anchor = node


def _merge(graph: fx.Graph, bucket: _Bucket) -> None:
    inputs = [reduce.args[0] for reduce, _ in bucket.members]
    values = [i.meta["val"] for i in inputs]
    mode = values[0].fake_mode
    position = {node: i for i, node in enumerate(graph.nodes)}
    anchor = max(inputs, key=position.__getitem__)  # the merged collective's inputs all exist here

    def add(target, *args) -> fx.Node:
        nonlocal anchor
        node = graph.call_function(target, args)
        anchor.append(node)  # right after the previous new node: the new nodes stay in order
        anchor = node
        if target is not operator.getitem:
            with mode:
                node.meta["val"] = target(*fx.node.map_arg(args, lambda n: n.meta["val"]))
        return node

    flats = [add(aten.view.default, i, [-1]) for i in inputs]
    reduced = add(_ALL_REDUCE.default, add(aten.cat.default, flats), *bucket.key[:2])
    parts = add(aten.split_with_sizes.default, add(_WAIT.default, reduced), [v.numel() for v in values])
    for index, ((reduce, wait), value) in enumerate(zip(bucket.members, values)):
        part = add(operator.getitem, parts, index)
        part.meta["val"] = parts.meta["val"][index]
        wait.replace_all_uses_with(add(aten.view.default, part, list(value.shape)))
        graph.erase_node(wait)
        graph.erase_node(reduce)


def bucket_all_reduces(gm: fx.GraphModule) -> int:
    """Merge `gm`'s functional all-reduces into buckets (in place); returns how many all-reduces
    were merged away."""
    buckets = _buckets(gm.graph)
    for bucket in buckets:
        _merge(gm.graph, bucket)
    if not buckets:
        return 0
    _stable_topological_order(gm.graph)
    gm.graph.lint()
    gm.recompile()
    merged = sum(len(b.members) for b in buckets)
    log.info("kiln: %d all-reduces merged into %d buckets of up to %d MiB", merged, len(buckets),
             BUCKET_BYTES >> 20)
    return merged - len(buckets)
