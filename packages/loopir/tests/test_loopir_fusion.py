"""The scheduler: what fuses into one kernel, what does not, and the recorded reasons."""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import Kernel, Reduction, lower


def _calls(kg) -> list[str]:
    return [n.name for n in kg.gm.graph.nodes if n.op == "call_function"]


def test_silu_plus_tanh_is_one_kernel_of_one_node(check):
    kg = check(lambda x: x * torch.sigmoid(x) + torch.tanh(x), torch.randn(8, 5))
    (kernel,) = kg.kernels
    assert len(kernel.nodes) == 1 and not kernel.temporaries
    assert [i.name for i in kernel.inputs] == ["x_1"] and not kernel.symbols
    (arg,) = [n for n in kg.gm.graph.nodes if isinstance(n.target, Kernel)][0].args
    # the kernel reads the placeholder through the layout guard
    assert arg.target.__name__ == "ensure_layout" and arg.args[0] is next(iter(kg.gm.graph.nodes))


def test_value_used_twice_at_same_index_is_a_fused_temporary(check):
    def f(x):
        y = x.exp()  # used by mul and sigmoid: realized as a buffer
        return y * torch.sigmoid(y)

    kg = check(f, torch.randn(4, 6))
    (kernel,) = kg.kernels
    assert [n.name for n in kernel.nodes] == ["buf0", "buf1"]
    assert [t.name for t in kernel.temporaries] == ["buf0"]
    assert [o.name for o in kernel.outputs] == ["buf1"]
    fused = {d.buffer: d for d in kg.decisions}
    assert fused["buf1"].fused and fused["buf1"].kernel == "kernel0"


def test_transposed_read_is_not_fused_and_says_why(check):
    def f(x):
        y = x.exp()
        return y + y.t()

    kg = check(f, torch.randn(4, 4))
    assert len(kg.kernels) == 2
    assert [o.name for o in kg.kernels[0].outputs] == ["buf0"]  # the temporary had to be stored
    decision = next(d for d in kg.decisions if d.buffer == "buf1")
    assert not decision.fused and decision.kernel == "kernel1"
    assert decision.kind == "reads_elsewhere" and decision.detail.startswith("buf0 at i0 + 4*i1")


def test_a_row_node_contiguous_across_a_column_sums_order_is_not_fused(check):
    """A bias gradient (a sum over dim 0, its loads contiguous along the outer loop) and a
    [256, 1024] relu backward of the same element count: as the sum's rows (256 of them) the
    pointwise node would be loaded and stored with a stride of 256 on every vector lane, so it
    gets its own kernel, row by row, and says why; a softmax's rows still fuse."""
    def f(b, h, g):
        w = torch.where(h <= 0, 0.0, g)
        return b.sum(0, keepdim=True), w.t() @ h[:, :512]

    kg = check(f, *(torch.randn(256, 1024) for _ in range(3)))
    decision = next(d for d in kg.decisions if d.buffer == "buf1")
    assert not decision.fused and decision.kind == "walks_across", decision
    assert "contiguous along the row loops, the reductions along the outer loops" in decision.detail
    (relu_backward,) = [k for k in kg.kernels if any(n.name == "buf1" for n in k.nodes)]
    assert not relu_backward.row_ranges and [n.name for n in relu_backward.nodes] == ["buf1"]
    rows = check(lambda x: torch.exp(x - x.amax(-1, keepdim=True)), torch.randn(8, 32))
    assert len(rows.kernels) == 1 and all(d.fused for d in rows.decisions[1:])


def test_reduction_then_pointwise_over_its_outer_ranges_fuses(check):
    x = torch.randn(4, 6)
    for fn in (lambda x: x.sum(-1) * 2, lambda x: x.sum(-1, keepdim=True).sqrt() + 1,
               lambda x: x.mean(0, keepdim=True)):
        kg = check(fn, x)
        (kernel,) = kg.kernels
        assert [type(n.body).__name__ for n in kernel.nodes] == ["Reduction", "Pointwise"]
        assert [t.name for t in kernel.temporaries] == ["buf0"]


def test_size_one_dims_do_not_block_fusion(check):
    """A [4, 1] buffer is stored at i0 and read back at i0 (not i0 + i1)."""
    kg = check(lambda x: x.amax(-1, keepdim=True) + x.sum(-1, keepdim=True), torch.randn(4, 6))
    assert len(kg.kernels) == 1 and len(kg.kernels[0].nodes) == 3
    store = kg.kernels[0].nodes[0].accesses().writes[0]
    assert str(store.index) == "i0"


def test_reduction_then_broadcast_pointwise_without_row_fusion_starts_new_kernel(check):
    kg = check(lambda x: x - x.sum(-1, keepdim=True), torch.randn(4, 6), fuse_rows=False)
    assert len(kg.kernels) == 2
    decision = next(d for d in kg.decisions if d.buffer == "buf1")
    assert (decision.kind, decision.detail) == ("ranges_differ", "[4, 6] against [4, 1]")


def test_reduction_then_broadcast_pointwise_is_a_row_node(check):
    kg = check(lambda x: x - x.sum(-1, keepdim=True), torch.randn(4, 6))
    (kernel,) = kg.kernels
    reduction, row = kernel.nodes
    assert kernel.is_row(row) and not kernel.is_row(reduction)
    assert kernel.row_ranges == reduction.reduction_ranges
    assert [o.name for o in kernel.outputs] == [row.name]
    # the row node runs over (i0, r0): it reads the reduction at i0, where it was stored
    reads = {a.buffer: str(a.index) for a in kernel.accesses(row).reads}
    assert reads == {"x_1": "6*i0 + r0", reduction.name: "i0"}
    decision = next(d for d in kg.decisions if d.buffer == row.name)
    assert decision.fused and decision.kind == "row"


def _softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def test_softmax_without_row_fusion_is_four_kernels(check):
    """A shared `e` is realized, and a [5, 7] loop never fuses with a [5, 1] x [7] reduction."""
    kg = check(_softmax, torch.randn(5, 7), fuse_rows=False)
    assert [type(k.nodes[0].body).__name__ for k in kg.kernels] == [
        "Reduction", "Pointwise", "Reduction", "Pointwise"]
    assert [d.fused for d in kg.decisions] == [False] * 4


def test_softmax_is_one_kernel_of_rows(check):
    kg = check(_softmax, torch.randn(5, 7))
    (kernel,) = kg.kernels
    assert [kernel.is_row(n) for n in kernel.nodes] == [False, True, False, True]
    # the sum reads `e` from memory (written by the row loop before it)
    assert {o.name for o in kernel.outputs} == {kernel.nodes[1].name, kernel.nodes[3].name}


def test_row_temporaries_are_not_outputs(check):
    x = torch.randn(5, 7)
    x[1, 2] = float("nan")
    x[2] = float("-inf")
    kg = check(_softmax, x, row_temporaries=True)
    (kernel,) = kg.kernels
    exp, result = kernel.nodes[1], kernel.nodes[3]
    assert kernel.row_temporaries == (exp,)
    assert [o.name for o in kernel.outputs] == [result.name] and exp in kernel.temporaries
    # a row node that is a graph output stays an output
    def softmax_and_exp(x):
        e = (x - x.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True), e

    kg = check(softmax_and_exp, x, row_temporaries=True)
    (kernel,) = kg.kernels
    assert not kernel.row_temporaries and len(kernel.outputs) == 2


def _residual_layer_norm(x, residual):
    h = x + residual
    mean = h.mean(-1, keepdim=True)
    centered = h - mean
    return centered * torch.rsqrt((centered * centered).mean(-1, keepdim=True) + 1e-5)


@pytest.mark.parametrize("row_temporaries", [False, True])
def test_pointwise_before_a_row_reduction_joins_it_as_row_prologue(check, row_temporaries):
    x, residual = torch.randn(3, 5, 16), torch.randn(3, 5, 16)
    kg = check(_residual_layer_norm, x, residual, row_temporaries=row_temporaries, atol=1e-5, rtol=1e-5)
    (kernel,) = kg.kernels
    assert kernel.is_row(kernel.nodes[0]) and isinstance(kernel.nodes[1].body, Reduction)
    assert [str(r) for r in kernel.ranges] == ["3", "5", "1"]
    decision = next(d for d in kg.decisions if d.buffer == kernel.nodes[1].name)
    assert decision.fused and decision.kind == "row_prologue"
    assert (kernel.nodes[0] in kernel.row_temporaries) == row_temporaries
    kg = check(_residual_layer_norm, x, residual, tracing_mode="symbolic",
               run_args=(torch.randn(2, 7, 9), torch.randn(2, 7, 9)), atol=1e-5, rtol=1e-5)
    assert len(kg.kernels) == 1


def test_pointwise_before_a_reduction_over_other_dims_stays_apart(check):
    def f(x, y):
        h = x + y  # used twice: a buffer of its own
        return h.sum(1), h * 2

    kg = check(f, torch.randn(3, 4, 5), torch.randn(3, 4, 5))
    (reduction,) = [k for k in kg.kernels if any(isinstance(n.body, Reduction) for n in k.nodes)]
    assert len(reduction.nodes) == 1


def test_reduction_over_a_middle_dim_does_not_take_rows(check):
    kg = check(lambda x: x - x.sum(1, keepdim=True), torch.randn(3, 4, 5))
    assert len(kg.kernels) == 2


def test_row_fusion_with_dynamic_shapes(check):
    kg = check(_softmax, torch.randn(5, 7), tracing_mode="symbolic", run_args=(torch.randn(3, 11),))
    assert len(kg.kernels) == 1


def test_every_computed_buffer_has_one_decision(check):
    kg = check(lambda x: (x.exp() + x.exp().sum(0)).sum(-1), torch.randn(3, 4))
    buffers = [n.name for k in kg.kernels for n in k.nodes]
    assert sorted(d.buffer for d in kg.decisions) == sorted(buffers)
    for d in kg.decisions:
        assert d.kernel in {k.name for k in kg.kernels} and d.reason
        assert d.fused == (d.kind in ("same_ranges", "merged_dims", "row", "row_prologue"))


def test_kernel_keeps_growing_past_an_unrelated_extern(check):
    def f(x, a, b):
        y = x.exp()
        m = a @ b  # does not read the open kernel
        return y * torch.sigmoid(y) + m

    kg = check(f, torch.randn(4, 4), torch.randn(4, 3), torch.randn(3, 4))
    (kernel,) = kg.kernels
    assert len(kernel.nodes) == 2 and len(kg.externs) == 1
    calls = _calls(kg)
    assert calls.index(kg.externs[0].name) < calls.index("kernel0")  # moved after the extern


def test_extern_reading_the_open_kernel_closes_it(check):
    def f(x, b):
        y = x.exp()
        return y @ b + y * 2  # reads the extern's result: it cannot run before it

    kg = check(f, torch.randn(4, 4), torch.randn(4, 4))
    assert len(kg.kernels) == 2
    decision = next(d for d in kg.decisions if d.buffer == "buf2")
    assert (decision.kind, decision.detail) == ("closed_by_extern", "kernel0 by buf1")


def test_a_value_of_a_closed_kernels_inputs_joins_that_kernel(check):
    """`y * 2` comes after the extern that closed `y`'s kernel, but reads only what that kernel
    holds: it joins it (one kernel, `y` read where stored) instead of a launch of its own."""
    def f(x, b):
        y = x.exp()
        return y @ b, y * 2

    kg = check(f, torch.randn(4, 4), torch.randn(4, 4))
    assert len(kg.kernels) == 1
    decision = next(d for d in kg.decisions if d.buffer == "buf2")
    assert decision.fused and decision.kernel == "kernel0" and "an earlier kernel" in decision.detail


def test_a_value_needing_a_later_result_never_joins_an_earlier_kernel(check):
    """A late pointwise value reading something produced after a closed kernel (here the
    matmul's result, transposed) cannot run inside that kernel: a kernel of its own."""
    def f(x, b):
        y = x.exp()
        m = y @ b
        return m, y * 2 + m.t()

    kg = check(f, torch.randn(4, 4), torch.randn(4, 4))
    assert len(kg.kernels) == 2
    late = next(d for d in kg.decisions if d.buffer == "buf2")
    assert not late.fused and late.kernel == "kernel1"


def test_dead_code_is_dropped(check):
    def f(x):
        unused = x.sum(0)  # noqa: F841
        torch.mm(x, x)
        return x * 2

    gm = make_fx(f)(torch.randn(3, 3))
    assert any(n.target == torch.ops.aten.sum.dim_IntList for n in gm.graph.nodes)
    kg = check(f, torch.randn(3, 3))
    assert len(kg.kernels) == 1 and not kg.externs and len(kg.kernels[0].nodes) == 1


def test_output_returned_twice_is_computed_once(check):
    def f(x):
        y = x + 1
        return y, y

    kg = check(f, torch.randn(3))
    assert len(kg.kernels[0].nodes) == 1
    a, b = kg(torch.randn(3))
    assert a is b


def test_lazy_value_used_by_one_node_is_inlined_not_stored(check):
    kg = check(lambda x: (x.exp() * 2).sum(-1), torch.randn(3, 4))
    (kernel,) = kg.kernels
    assert len(kernel.nodes) == 1  # exp and mul live inside the reduction's body


def test_reshaped_consumer_fuses(check):
    def f(x):
        y = x.exp()
        return y.view(24) * y.view(24).sigmoid()

    kg = check(f, torch.randn(4, 6))
    assert len(kg.kernels) == 1


def test_bias_add_then_gelu_through_a_reshape_is_one_kernel(check):
    """BERT's intermediate layer: mm + bias over [512, 64] viewed as [4, 128, 64] for GELU."""
    def f(x, b):
        h = (x + b).view(4, 128, 64)
        return (h * 0.5 * (1 + torch.erf(h * 0.7071067811865476))).view(512, 64)

    kg = check(f, torch.randn(512, 64), torch.randn(64))
    (kernel,) = kg.kernels
    assert len(kernel.nodes) == 2 and kernel.temporaries  # the sum stays in a register


def test_merged_placement_skips_size_one_dims():
    from kiln.loopir._internal.ir import merged_index
    i0, i1, i2 = sympy.symbols("i0 i1 i2", integer=True, nonnegative=True)
    assert merged_index([3], [3, 1]) == (i0,)
    assert merged_index([12, 5], [3, 4, 5]) == (4 * i0 + i1, i2)
    assert merged_index([1, 12], [3, 4]) == (0, 4 * i0 + i1)
    assert merged_index([5, 12], [3, 4, 5]) is None  # not consecutive products


def test_masked_safe_softmax_read_through_a_merged_view_is_one_kernel(check):
    """BERT's attention probabilities: scores + mask, _safe_softmax, viewed [B*H, S, S] for bmm.
    The final division is a row node whose dims merge the kernel's (12*i0 + i1, i2, r0)."""
    def f(scores, mask):  # aten._safe_softmax as torch decomposes it
        x = scores + mask
        e = (x - x.amax(-1, keepdim=True)).exp()
        masked = (x == float("-inf")).all(-1, keepdim=True)
        return torch.where(masked, 0.0, e / e.sum(-1, keepdim=True)).view(6, 8, 8)

    mask = torch.where(torch.rand(2, 1, 8, 8) > 0.3, 0.0, float("-inf"))
    mask[0, 0, 1] = float("-inf")  # a fully masked row: _safe_softmax gives zeros
    for row_temporaries in (False, True):
        kg = check(f, torch.randn(2, 3, 8, 8), mask, row_temporaries=row_temporaries)
        (kernel,) = kg.kernels
        assert kernel.is_row(kernel.nodes[-1]) and kernel.nodes[-1].ranges != kernel.nodes[0].ranges


def test_placement_pins_the_variables_of_size_one_outer_ranges(check):
    """A [16, 8] node in a kernel over [1, 16, 8] (a batch sum kept as [1, S, D]) runs at
    (i1, i2); i0, whose range is 1, appears in no placement (codegens need not define it)."""
    kg = check(lambda x: (x.sum(0, keepdim=True), x[0] * 2), torch.randn(4, 16, 8))
    (kernel,) = kg.kernels
    i0, i1, i2 = sympy.symbols("i0 i1 i2", integer=True, nonnegative=True)
    assert list(kernel.ranges) == [1, 16, 8]
    assert kernel.placement(kernel.nodes[1])[0] == (i1, i2)
    for node in kernel.nodes:
        index, _ = kernel.placement(node)
        assert not any(i0 in sympy.sympify(e).free_symbols for e in index)
        assert kernel.accesses(node).writes[0].index.free_symbols >= {i1, i2}


def test_nested_output_structures_are_kept():
    """(a, (b, c)) and [max's (values, indices), None] come back nested as the graph returned them
    (a direct API user's make_fx graph; Dynamo flattens its outputs), also from the wrapper a
    codegen builds with `with_kernels`."""
    from kiln.loopir import lower

    x = torch.randn(2, 5)
    for fn in (lambda x: (x + 1, (x * 2, x - 1)), lambda x: (x.sum(), [tuple(torch.max(x, 1)), None])):
        kg = lower(make_fx(fn)(x))
        for run in (kg, kg.with_kernels({k.name: k for k in kg.kernels})):
            got, want = run(x), fn(x)
            assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(want)
            torch.testing.assert_close(got, want)


def _norm_and_bias_gradients(g, x, h):
    """A transformer backward's column sums: a layer norm's weight and bias gradients (`[32]`,
    over `[2, 16]`) and the next linear's bias gradient (`[1, 32]`, over the flattened rows)."""
    return (g * x).sum((0, 1)), g.sum((0, 1)), h.reshape(-1, h.shape[-1]).sum(0, keepdim=True)


@pytest.mark.parametrize("tracing_mode", ["real", "symbolic"])
def test_reductions_over_the_same_outputs_up_to_size1_dims_share_a_kernel(check, tracing_mode):
    """Reductions whose outer ranges differ only by size-1 dims (`[1, 32]` against `[32]`) compute
    the same outputs in the same order: they join one kernel (each keeps its own reduction loop),
    with concrete and symbolic sizes; before, each such bias gradient was a kernel of its own."""
    args = [torch.randn(2, 16, 32) for _ in range(3)]
    kg = check(_norm_and_bias_gradients, *args, tracing_mode=tracing_mode, rtol=1e-5, atol=1e-5)
    (kernel,) = kg.kernels
    bias = next(n for n in kernel.nodes if len(n.ranges) == 2)
    assert [str(r) for r in bias.ranges][0] == "1"
    assert kernel.placement(bias)[0][0] == 0  # the size-1 dim's index is the constant 0
    decision = next(d for d in kg.decisions if d.buffer == bias.name)
    assert decision.fused and decision.kind == "merged_dims", decision


def test_a_column_sum_beside_row_sums_of_as_many_elements_is_not_merged(check):
    """Equal element counts in other dims are not the same outputs: a `[32]` column sum next to
    `[2, 16]` row sums keeps its own kernel (the reason says the ranges differ)."""
    def f(x):
        return x.sum(-1), x.sum((0, 1))

    kg = check(f, torch.randn(2, 16, 32), rtol=1e-5, atol=1e-5)
    assert len(kg.kernels) == 2
    decision = next(d for d in kg.decisions if d.buffer == "buf1")
    assert not decision.fused and decision.kind == "ranges_differ", decision


def test_a_reduction_joins_an_earlier_kernel_holding_its_inputs_or_a_sibling(check):
    """A reduction that cannot join the open kernel (closed by a matmul) joins the earlier kernel
    that loads its input (`x.amax(0)` beside `x.sum(0)`), or, reading other inputs, one with a
    reduction over the same outer and reduction ranges (`z.sum(0)`, a sibling: the bias
    gradients of three projections); one that needs a later result keeps its own kernel."""
    def f(x, b, z):
        return x.sum(0), b.exp() @ b, x.amax(0), z.sum(0)

    args = [torch.randn(8, 8) for _ in range(3)]
    kg = check(f, *args)
    assert len(kg.kernels) == 2
    for buffer in ("buf3", "buf4"):
        decision = next(d for d in kg.decisions if d.buffer == buffer)
        assert decision.fused and decision.kernel == "kernel0" and "an earlier kernel" in decision.detail, decision
    # Without sibling joins (codegen_triton's choice) only the reduction sharing an input joins.
    kg = lower(make_fx(f)(*args), join_sibling_reductions=False)
    torch.testing.assert_close(kg(*args), f(*args))
    assert len(kg.kernels) == 3
    assert next(d for d in kg.decisions if d.buffer == "buf3").kernel == "kernel0"
    assert not next(d for d in kg.decisions if d.buffer == "buf4").fused

    def later(x, b):
        return x.sum(0), b.exp() @ b, (x @ b.t()).sum(0)  # the second matmul runs after kernel0

    kg = check(later, *[torch.randn(8, 8) for _ in range(2)])
    assert len(kg.kernels) == 3
    decision = next(d for d in kg.decisions if d.buffer == "buf4")
    assert not decision.fused and decision.kind == "closed_by_extern", decision
