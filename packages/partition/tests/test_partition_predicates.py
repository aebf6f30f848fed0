"""The predicate helpers and their composition."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.partition import Supported, partition, supports_devices, supports_dtypes, supports_ops

aten = torch.ops.aten


def nodes_of(fn, *args) -> dict[str, fx.Node]:
    gm = make_fx(fn)(*args)
    return {n.name: n for n in gm.graph.nodes}


def mixed_graph():
    def fn(x, i):
        y = torch.add(x, 1)
        z = torch.add(y, 2.0, alpha=3)  # aten.add.Tensor too: scalars are wrapped
        j = torch.add(i, i)
        var_mean = torch.var_mean(y)
        return z, j.float(), var_mean

    return nodes_of(fn, torch.randn(3), torch.arange(3))


def test_overload_matches_only_itself_and_packet_matches_all_overloads():
    nodes = mixed_graph()
    add = nodes["add"]
    assert add.target is aten.add.Tensor
    assert supports_ops({aten.add.Tensor})(add)
    assert not supports_ops({aten.add.Scalar})(add)
    assert supports_ops({aten.add})(add)
    assert not supports_ops({aten.sub})(add)


def test_plain_callables_method_names_and_module_types():
    graph = fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
    relu, tanh = [n for n in graph.graph.nodes if n.op == "call_module"]
    assert supports_ops({torch.nn.ReLU})(relu) and not supports_ops({torch.nn.ReLU})(tanh)

    traced = fx.symbolic_trace(lambda x: x.add(1)[0] + torch.relu(x))
    by_name = {n.name: n for n in traced.graph.nodes}
    assert supports_ops({"add"})(by_name["add"])
    assert supports_ops({operator.getitem})(by_name["getitem"])
    assert supports_ops({torch.relu})(by_name["relu"]) and not supports_ops({"relu"})(
        by_name["relu"]
    )
    with pytest.raises(TypeError, match="not an op"):
        supports_ops({3})


def test_dtype_predicate_reads_every_tensor_of_val():
    nodes = mixed_graph()
    floats = supports_dtypes({torch.float32})
    assert floats(nodes["add"]) and not floats(nodes["add_2"])  # add_2 is the int64 add
    assert floats(nodes["var_mean"])  # a tuple of two float tensors
    nodes["var_mean"].meta["val"] = (nodes["add"].meta["val"], nodes["add_2"].meta["val"])
    assert not floats(nodes["var_mean"])
    del nodes["add"].meta["val"]
    assert not floats(nodes["add"])
    with pytest.raises(TypeError, match="torch.dtype"):
        supports_dtypes({"float32"})


def test_device_predicate_ignores_index():
    nodes = mixed_graph()
    assert supports_devices({"cpu"})(nodes["add"])
    assert supports_devices({torch.device("cpu")})(nodes["add"])
    assert not supports_devices({"cuda:0"})(nodes["add"])
    assert not supports_devices({"meta"})(nodes["var_mean"])


def test_composition_and_repr():
    nodes = mixed_graph()
    ops = supports_ops({aten.add})
    floats = supports_dtypes({torch.float32})
    both = ops & floats
    assert both(nodes["add"]) and not both(nodes["add_2"]) and not both(nodes["var_mean"])
    either = ops | floats
    assert either(nodes["add_2"]) and either(nodes["var_mean"])
    assert (~ops)(nodes["var_mean"]) and not (~ops)(nodes["add"])
    assert repr(both) == "Supported((ops{aten.add} & dtypes{float32}))"
    assert repr(~ops) == "Supported(~ops{aten.add})"

    def no_var_mean(node):
        return node.name != "var_mean"

    mixed = no_var_mean & either
    assert isinstance(mixed, Supported) and not mixed(nodes["var_mean"]) and mixed(nodes["add"])
    assert "no_var_mean" in repr(either | no_var_mean)


def test_composed_predicate_drives_partition():
    def fn(x, i):
        return torch.add(x, 1).exp(), torch.add(i, 1)

    gm = make_fx(fn)(torch.randn(3), torch.arange(3))
    out = partition(gm, supports_ops({aten.add, aten.exp}) & supports_dtypes({torch.float32}))
    (sub_name,) = [n.target for n in out.graph.nodes if n.op == "call_module"]
    sub = getattr(out, sub_name)
    assert [n.name for n in sub.graph.nodes if n.op == "call_function"] == ["add", "exp"]
    report = out.meta["kiln_partition"]
    assert [(u.name, u.op) for u in report.unsupported] == [("add_1", "aten.add.Tensor")]
    assert "dtypes{float32}" in report.predicate
