"""partition_joint: what each strategy saves, recomputes and why; numerics of fw + bw."""

from __future__ import annotations

import logging

import pytest
import torch
import torch._dynamo
import torch.fx

from kiln.autograd_trace import (
    JointGraph,
    Partition,
    aot_compile,
    partition_joint,
    trace_joint,
    verify,
)
from kiln.autograd_trace._internal.recompute import is_random

aten = torch.ops.aten


def run_partition(
    joint: JointGraph, partition: Partition, primals: list[object], tangents: list[torch.Tensor]
) -> tuple[list[object], list[object]]:
    results = list(partition.fw_gm(*primals))
    forward, saved = results[: joint.num_forward_outputs], results[joint.num_forward_outputs :]
    assert len(saved) == len(partition.saved)
    return forward, list(partition.bw_gm(*saved, *tangents))


def mlp(x, w1, w2):
    return (x @ w1).sin() @ w2


def mlp_inputs() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    # A wide hidden layer: recomputing `x @ w1` needs far less memory than saving it.
    x = torch.randn(64, 4, generator=generator)
    w1 = torch.randn(4, 64, generator=generator).requires_grad_()
    w2 = torch.randn(64, 4, generator=generator).requires_grad_()
    return [x, w1, w2]


def check_numerics(joint: JointGraph, partition: Partition, inputs: list[torch.Tensor]) -> None:
    tangent = torch.randn(joint.forward_output_nodes[0].meta["val"].shape)
    forward, grads = run_partition(joint, partition, [t.detach() for t in inputs], [tangent])
    expected = mlp(*inputs)
    wanted = torch.autograd.grad(expected, [inputs[1], inputs[2]], tangent)
    torch.testing.assert_close(forward[0], expected)
    for got, want in zip(grads, wanted, strict=True):
        torch.testing.assert_close(got, want)


def test_save_all_saves_every_forward_value_the_backward_reads() -> None:
    inputs = mlp_inputs()
    joint = trace_joint(mlp, inputs)
    partition = partition_joint(joint, "save_all")
    verify(partition)
    fw_gm, bw_gm = partition
    assert fw_gm is partition.fw_gm and bw_gm is partition.bw_gm
    saved = {s.name: s for s in partition.saved}
    assert set(saved) == {"x", "w2", "mm", "sin"}
    assert saved["x"].is_input and saved["x"].reason.startswith("graph input")
    assert saved["sin"].nbytes == 64 * 64 * 4 and saved["sin"].shape == (64, 64)
    assert partition.recomputed == ()
    assert partition.saved_bytes == (64 * 4 + 64 * 4 + 2 * 64 * 64) * 4
    assert partition.activation_bytes == 2 * 64 * 64 * 4
    assert "backward" not in str(fw_gm.code) and aten.cos.default not in [
        n.target for n in fw_gm.graph.nodes
    ]
    check_numerics(joint, partition, inputs)


def test_min_cut_recomputes_cheap_ops_and_saves_fewer_bytes() -> None:
    inputs = mlp_inputs()
    joint = trace_joint(mlp, inputs)
    save_all = partition_joint(joint, "save_all")
    min_cut = partition_joint(joint, "min_cut")
    verify(min_cut)
    assert {s.name for s in min_cut.saved} == {"x", "w2", "mm"}
    assert min_cut.recomputed == ("sin",)
    assert min_cut.saved_bytes < save_all.saved_bytes
    mm = next(s for s in min_cut.saved if s.name == "mm")
    assert "not recomputed at level 'cheap'" in mm.reason
    recomputed = [n for n in min_cut.bw_gm.graph.nodes if n.meta.get("kiln_recomputed")]
    assert [n.target for n in recomputed] == [aten.sin.default]
    check_numerics(joint, min_cut, inputs)
    assert "min_cut" in str(min_cut) and "recomputed in backward: sin" in str(min_cut)


def test_memory_budget_makes_min_cut_recompute_matmuls(caplog: pytest.LogCaptureFixture) -> None:
    inputs = mlp_inputs()
    joint = trace_joint(mlp, inputs)
    default = partition_joint(joint, "min_cut")
    inputs_only = 3 * 64 * 4 * 4
    tight = partition_joint(joint, "min_cut", memory_budget=inputs_only)
    assert tight.budget_met and tight.recompute_level == "all"
    assert tight.saved_bytes <= inputs_only < default.saved_bytes
    assert tight.activation_bytes == 0
    assert aten.mm.default in [
        n.target for n in tight.bw_gm.graph.nodes if n.meta.get("kiln_recomputed")
    ]
    check_numerics(joint, tight, inputs)

    with caplog.at_level(logging.WARNING):
        impossible = partition_joint(joint, "min_cut", memory_budget=1)
    assert not impossible.budget_met and "NOT met" in str(impossible)
    assert "memory budget 1 B not met" in caplog.text
    check_numerics(joint, impossible, inputs)

    with pytest.raises(ValueError, match="memory_budget needs strategy='min_cut'"):
        partition_joint(joint, "save_all", memory_budget=10)
    with pytest.raises(ValueError, match="unknown partition strategy 'remat'"):
        partition_joint(joint, "remat")


def test_random_ops_are_never_recomputed_even_when_everything_else_is() -> None:
    def f(x, w):
        return torch.nn.functional.dropout(x * w, p=0.5, training=True).exp().sum()

    table = torch._decomp.get_decompositions([aten.native_dropout, aten.native_dropout_backward])
    x, w = torch.randn(64), torch.randn(64, requires_grad=True)
    joint = trace_joint(f, [x, w], decompositions=table)
    random_nodes = [n for n in joint.gm.graph.nodes if is_random(n)]
    assert random_nodes, "the decomposed dropout draws with an explicit random op"
    drawn = {user.name for n in random_nodes for user in [n, *n.users]}
    for budget in (None, 1):
        partition = partition_joint(joint, "min_cut", memory_budget=budget)
        assert partition.recompute_level == ("cheap" if budget is None else "all")
        assert not any(is_random(n) for n in partition.bw_gm.graph.nodes)
        assert sum(1 for n in partition.fw_gm.graph.nodes if is_random(n)) == len(random_nodes)
        assert drawn & {s.name for s in partition.saved}, "the draw (or its mask) is saved"

    def g(x, w):
        return torch.nn.functional.dropout(x * w, p=0.5, training=True).exp()

    compiled = aot_compile(g, [x, w], lambda gm, _: gm, decompositions=table, partitioner="min_cut")
    w_leaf = w.detach().requires_grad_()
    out = compiled(x, w_leaf)
    out.sum().backward()
    kept = out != 1  # exp(0) where dropped
    assert kept.any() and (~kept).any()
    expected = torch.where(kept, x * 2 * out.detach(), torch.zeros(()))
    torch.testing.assert_close(w_leaf.grad, expected)


@pytest.mark.parametrize("strategy", ["save_all", "min_cut"])
def test_symbolic_sizes_are_saved_as_sizes(strategy: str) -> None:
    partitions: list[Partition] = []

    def backend(gm, example_inputs):
        compiled = aot_compile(gm, example_inputs, lambda g, _: g, partitioner=strategy)
        verify(compiled.partition)
        partitions.append(compiled.partition)
        return compiled

    def f(x, w):
        return (x.reshape(x.shape[0], -1) @ w).relu().sum() / x.shape[0]

    torch._dynamo.reset()
    try:
        compiled = torch.compile(f, backend=backend, dynamic=True)
        for rows in (4, 7):  # sizes distinct from the others (duck sizing)
            x, w = torch.randn(rows, 2, 3), torch.randn(6, 5, requires_grad=True)
            w_eager = w.detach().requires_grad_()
            compiled(x, w).backward()
            f(x, w_eager).backward()
            torch.testing.assert_close(w.grad, w_eager.grad)
    finally:
        torch._dynamo.reset()
    (partition,) = partitions
    assert partition.num_saved_sizes >= 1
    size_inputs = [
        n
        for n in partition.bw_gm.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta["val"], torch.SymInt)
    ]
    assert len(size_inputs) == partition.num_saved_sizes


def test_min_cut_rebuilds_a_dropout_output_from_its_saved_mask() -> None:
    def f(x, w):
        # Attention-style: softmax's backward reads its output anyway, and the gradient of
        # the second matmul reads the dropout output, which is softmax * mask * scale.
        h = torch.nn.functional.dropout((x @ w).softmax(-1), p=0.3, training=True)
        return h @ w.t()

    x, w = torch.randn(16, 8), torch.randn(8, 8, requires_grad=True)
    joint = trace_joint(f, [x, w])
    dropout = next(n for n in joint.gm.graph.nodes if n.target is aten.native_dropout.default)
    output, mask = sorted(dropout.users, key=lambda n: n.args[1])
    save_all, min_cut = (partition_joint(joint, s) for s in ("save_all", "min_cut"))
    assert {output.name, mask.name} <= {s.name for s in save_all.saved}
    assert mask.name in {s.name for s in min_cut.saved}
    assert output.name not in {s.name for s in min_cut.saved}
    assert output.name in min_cut.recomputed
    assert min_cut.saved_bytes < save_all.saved_bytes

    for strategy in ("save_all", "min_cut"):
        compiled = aot_compile(f, [x, w], lambda gm, _: gm, partitioner=strategy)
        w_compiled, w_eager = (w.detach().clone().requires_grad_() for _ in range(2))
        torch.manual_seed(7)
        out = compiled(x, w_compiled)
        out.sum().backward()
        torch.manual_seed(7)
        expected = f(x, w_eager)
        expected.sum().backward()
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(w_compiled.grad, w_eager.grad)


def test_verify_rejects_a_partition_whose_backward_inputs_are_out_of_order() -> None:
    from kiln.autograd_trace import VerifyError

    partition = partition_joint(trace_joint(mlp, mlp_inputs()), "min_cut")
    verify(partition)
    first, second = [n for n in partition.bw_gm.graph.nodes if n.op == "placeholder"][:2]
    first.name, second.name = second.name + "_", first.name
    with pytest.raises(VerifyError, match="are not the saved values"):
        verify(partition)
