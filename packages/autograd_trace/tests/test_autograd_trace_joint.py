"""trace_joint: structure of the joint graph and its numerics against eager autograd."""

from __future__ import annotations

import operator

import pytest
import torch
import torch._dynamo
import torch.fx

from kiln.autograd_trace import JointGraph, TraceError, VerifyError, trace_joint, verify

aten = torch.ops.aten


def targets(gm: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def run_joint(
    joint: JointGraph, primals: list[object], tangents: list[torch.Tensor]
) -> list[object]:
    return list(joint.gm(*primals, *tangents))


def test_joint_computes_outputs_and_input_gradients() -> None:
    def f(x, w):
        return (x @ w).relu().sum(-1)

    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    joint = trace_joint(f, [x, w])
    verify(joint)

    assert [n.name for n in joint.primals] == ["x", "w"]
    assert [n.name for n in joint.tangents] == ["tangent_0"]
    assert joint.grad_inputs == (1,) and joint.tangent_outputs == (0,)
    assert all(
        isinstance(t, torch._ops.OpOverload) for t in targets(joint.gm) if t is not operator.getitem
    )
    assert aten.threshold_backward.default in targets(joint.gm)

    tangent = torch.randn(4)
    out, grad_w = run_joint(joint, [x, w.detach()], [tangent])
    expected = f(x, w)
    (expected_grad,) = torch.autograd.grad(expected, [w], tangent)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad_w, expected_grad)


def test_joint_is_functional_and_records_mutations() -> None:
    def f(x, y, stats):
        stats.add_(x.mean(0))
        y.mul_(2)
        return (x * y).sum()

    x, y, stats = torch.randn(3, 4, requires_grad=True), torch.randn(4), torch.zeros(4)
    joint = trace_joint(f, [x, y, stats])
    verify(joint)
    assert joint.mutated_inputs == (1, 2)
    assert [i.mutated for i in joint.inputs] == [False, True, True]
    assert not any(
        t._schema.is_mutable for t in targets(joint.gm) if isinstance(t, torch._ops.OpOverload)
    )
    assert joint.num_forward_outputs == 3  # new y, new stats, the sum
    # stats now holds a value computed from x: like in eager, its new value requires grad.
    assert joint.tangent_outputs == (1, 2)

    y_before, stats_before = y.clone(), stats.clone()
    stats_tangent = torch.randn(4)
    new_y, new_stats, out, grad_x = run_joint(
        joint, [x.detach(), y, stats], [stats_tangent, torch.tensor(1.0)]
    )
    torch.testing.assert_close(new_y, y * 2)
    torch.testing.assert_close(new_stats, x.detach().mean(0))
    torch.testing.assert_close(out, (x.detach() * y * 2).sum())
    torch.testing.assert_close(grad_x, (y * 2 + stats_tangent / 3).expand(3, 4))
    torch.testing.assert_close(y, y_before)  # the joint graph itself mutates nothing
    torch.testing.assert_close(stats, stats_before)


def test_output_aliasing_is_recorded() -> None:
    def f(x, w):
        h = x * w
        return x.view(-1), h, h[0], h, x

    joint = trace_joint(f, [torch.randn(2, 3), torch.randn(3, requires_grad=True)])
    assert [o.source for o in joint.outputs] == [
        "input_view",
        "forward",
        "forward",
        "output",
        "input",
    ]
    assert joint.outputs[0].view == ((6,), (1,), 0)
    assert joint.outputs[2].aliases == (1,)
    assert joint.outputs[3].index == 1
    assert [o.requires_grad for o in joint.outputs] == [False, True, True, True, False]
    assert joint.num_forward_outputs == 2


def test_graph_module_with_parameters_lifts_them_to_primals() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    model[2].bias.requires_grad_(False)
    joint = trace_joint(torch.fx.symbolic_trace(model), [torch.randn(5, 3)])
    verify(joint)
    names = [(i.name, i.lifted_name, i.requires_grad) for i in joint.inputs]
    assert names == [
        ("input_1", None, False),
        ("0_weight", "0.weight", True),
        ("0_bias", "0.bias", True),
        ("2_weight", "2.weight", True),
        ("2_bias", "2.bias", False),
    ]
    assert joint.grad_inputs == (1, 2, 3)
    assert not any(n.op == "get_attr" for n in joint.gm.graph.nodes)


def test_decompositions_apply_to_forward_and_backward_ops() -> None:
    def f(x):
        return torch.nn.functional.silu(x).sum()

    table = torch._decomp.get_decompositions([aten.silu, aten.silu_backward])
    joint = trace_joint(f, [torch.randn(5, requires_grad=True)], decompositions=table)
    ops = targets(joint.gm)
    assert aten.silu.default not in ops and aten.silu_backward.default not in ops
    assert aten.sigmoid.default in ops
    x = torch.randn(5, requires_grad=True)
    out, grad = run_joint(joint, [x.detach()], [torch.tensor(1.0)])
    (expected,) = torch.autograd.grad(f(x), [x])
    torch.testing.assert_close(grad, expected)


def test_symbolic_shapes_from_dynamo() -> None:
    joints: list[JointGraph] = []

    def backend(gm, example_inputs):
        joint = trace_joint(gm, example_inputs)
        verify(joint)
        joints.append(joint)
        return gm

    def f(x, w):
        return (x.view(x.shape[0], -1) @ w).sum(0) * x.shape[0]

    torch._dynamo.reset()
    try:
        compiled = torch.compile(f, backend=backend, dynamic=True)
        compiled(torch.randn(4, 2, 3), torch.randn(6, 2, requires_grad=True))
    finally:
        torch._dynamo.reset()
    (joint,) = joints
    symint_primals = [p for p in joint.primals if isinstance(p.meta["val"], torch.SymInt)]
    assert symint_primals, "Dynamo passes sizes as SymInt inputs"
    x_val = next(
        p.meta["val"]
        for p in joint.primals
        if isinstance(p.meta["val"], torch.Tensor) and p.meta["val"].dim() == 3
    )
    assert isinstance(x_val.shape[0], torch.SymInt)
    assert joint.grad_inputs, "w requires grad"
    grad_val = joint.grad_nodes[0].meta["val"]
    assert tuple(grad_val.shape) == (6, 2)


def test_trace_errors_name_the_problem() -> None:
    def resizes(x):
        x.unsqueeze_(0)
        return x

    with pytest.raises(TraceError, match="size/stride changed in place"):
        trace_joint(resizes, [torch.randn(3)])

    def mutates_alias(x, y):
        x.add_(1)
        return y * 2

    base = torch.randn(4)
    with pytest.raises(TraceError, match="shares memory with input 'y'"):
        trace_joint(mutates_alias, [base, base[:2]])


def test_verify_rejects_a_joint_with_a_write_back() -> None:
    joint = trace_joint(lambda x: x * 2, [torch.randn(3, requires_grad=True)])
    graph = joint.gm.graph
    output = graph.output_node()
    with graph.inserting_before(output):
        copy = graph.call_function(aten.copy_.default, (joint.primals[0], output.args[0][0]))
    copy.meta["val"] = joint.primals[0].meta["val"]
    joint.gm.recompile()
    with pytest.raises(VerifyError, match="write no inputs"):
        verify(joint)
