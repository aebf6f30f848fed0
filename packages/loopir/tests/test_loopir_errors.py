"""Errors name the node and what to do; `verify` accepts lowered graphs and rejects broken ones."""

from __future__ import annotations

import dataclasses
import operator

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import Kernel, LoweringError, lower, verify
from kiln.loopir._internal.ir import BufferSpec
from kiln.loopir._internal.verify import verify_kernel

aten = torch.ops.aten


def test_unsupported_op_names_the_node():
    gm = make_fx(lambda x: torch.kthvalue(x, 1).values + 1)(torch.randn(4))
    with pytest.raises(LoweringError, match=r"no loopir lowering for node 'kthvalue' = aten\.kthvalue\.default") as e:
        lower(gm)
    assert "supported_ops()" in str(e.value)


def test_error_quotes_the_user_source_line():
    gm = make_fx(lambda x: torch.kthvalue(x, 1).values)(torch.randn(4))
    node = next(n for n in gm.graph.nodes if n.target == aten.kthvalue.default)
    node.meta["stack_trace"] = '  File "model.py", line 7, in forward\n    y = torch.kthvalue(x, 1).values\n'
    with pytest.raises(LoweringError, match=r"line 7, in forward: y = torch\.kthvalue\(x, 1\)\.values"):
        lower(gm)


def test_unsupported_input_dtype_names_the_placeholder():
    gm = make_fx(lambda x: x * 2)(torch.ones(4, dtype=torch.uint16))
    with pytest.raises(LoweringError, match=r"dtype torch\.uint16 is not supported.*'x_1'"):
        lower(gm)


def test_unsupported_result_dtype_names_the_node():
    gm = make_fx(lambda x: (x * 2).to(torch.complex64))(torch.randn(4))
    with pytest.raises(LoweringError, match=r"dtype torch\.complex64 .*'_to_copy'"):
        lower(gm)


def test_missing_meta_val_is_explained():
    gm = fx.symbolic_trace(lambda x: torch.relu(x))
    with pytest.raises(LoweringError, match=r"placeholder 'x' has no meta\['val'\]"):
        lower(gm)


def test_call_module_is_rejected():
    gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.ReLU()))
    for node in gm.graph.nodes:
        node.meta["val"] = torch.empty(2)
    with pytest.raises(LoweringError, match="call_module"):
        lower(gm)


def test_lowering_failure_inside_a_rule_is_wrapped_with_the_node():
    gm = make_fx(lambda x: x.to("meta"))(torch.randn(3))
    with pytest.raises(LoweringError, match=r"lowering failed for node '_to_copy'.*device-changing"):
        lower(gm)


def _lowered():
    def f(x, y):
        e = x.exp()
        # contiguous: a transposed read of e, so a second kernel (eager's e.t() + 1 is
        # transposed, and would run in e's memory order, fused into the first)
        return e * e.sigmoid() + y, (e.t() + 1).contiguous()

    return lower(make_fx(f)(torch.randn(3, 3), torch.randn(3)))


def test_verify_accepts_lowered_graphs():
    kg = _lowered()
    verify(kg)
    assert len(kg.kernels) == 2


def _with_kernel(kg, index, **changes):
    """`kg` with kernel `index` replaced (in the record and in the FX graph)."""
    old = kg.kernels[index]
    new = dataclasses.replace(old, **changes)
    for node in kg.gm.graph.nodes:
        if node.target is old:
            node.target = new
    kernels = kg.kernels[:index] + (new,) + kg.kernels[index + 1:]
    return dataclasses.replace(kg, kernels=kernels)


def test_verify_rejects_unlisted_kernel():
    kg = _lowered()
    broken = dataclasses.replace(kg, kernels=kg.kernels[:1])
    with pytest.raises(ValueError, match="calls kernel1, which the KernelGraph does not list"):
        verify(broken)


def test_verify_rejects_wrong_arity():
    kg = _lowered()
    call = next(n for n in kg.gm.graph.nodes if isinstance(n.target, Kernel))
    call.args = call.args + (call.args[0],)
    with pytest.raises(ValueError, match=r"passes 3 args to kernel0, which takes 2 tensors and 0 sizes"):
        verify(kg)


def test_verify_rejects_kernel_without_outputs():
    kernel = _lowered().kernels[0]
    with pytest.raises(ValueError, match="kernel0 computes nothing used outside it"):
        verify_kernel(dataclasses.replace(kernel, outputs=()))


def test_verify_rejects_read_of_unknown_buffer():
    kernel = _lowered().kernels[0]
    assert [i.name for i in kernel.inputs] == ["x_1", "y_1"]
    with pytest.raises(ValueError, match="buf1 reads y_1, which is neither an input"):
        verify_kernel(dataclasses.replace(kernel, inputs=kernel.inputs[:1]))


def test_verify_rejects_fusion_of_a_shifted_read():
    kg = _lowered()
    k0, k1 = kg.kernels
    # Put kernel1's transposed reader into kernel0: it reads buf0 where it was not stored.
    merged = _with_kernel(kg, 0, nodes=k0.nodes + k1.nodes)
    with pytest.raises(ValueError, match=r"reads buf0 at i0 \+ 3\*i1, not where it was stored"):
        verify(merged)


def test_verify_rejects_mismatched_ranges():
    kg = _lowered()
    first, second = kg.kernels[0].nodes
    bad = dataclasses.replace(second, body=dataclasses.replace(second.body, ranges=(3,)))
    with pytest.raises(ValueError, match=r"kernel0: buf1 iterates \[3\], kernel iterates \[3, 3\]"):
        verify(_with_kernel(kg, 0, nodes=(first, bad)))


def test_verify_rejects_missing_size_symbol():
    kg = lower(make_fx(lambda x: x.t() + 1, tracing_mode="symbolic")(torch.randn(3, 4)))
    verify(kg)
    kernel = kg.kernels[0]
    with pytest.raises(ValueError, match=r"kernel0 uses size symbols \['s\d+', 's\d+'\] that are not among"):
        verify_kernel(dataclasses.replace(kernel, symbols=()))


def test_verify_rejects_kernel_called_twice():
    kg = _lowered()
    graph = kg.gm.graph
    call = next(n for n in graph.nodes if isinstance(n.target, Kernel))
    with graph.inserting_after(call):
        again = graph.call_function(call.target, call.args)
    with graph.inserting_after(again):
        graph.call_function(operator.getitem, (again, 0))
    with pytest.raises(ValueError, match="kernel0 is called 2 times"):
        verify(kg)


def test_verify_rejects_output_not_computed():
    kg = _lowered()
    ghost = BufferSpec.contiguous("ghost", torch.float32, (3, 3))
    with pytest.raises(ValueError, match="lists output ghost"):
        verify(_with_kernel(kg, 0, outputs=kg.kernels[0].outputs + (ghost,)))


def test_verify_rejects_bad_fx_graph():
    kg = _lowered()
    call = next(n for n in kg.gm.graph.nodes if isinstance(n.target, Kernel))
    with kg.gm.graph.inserting_before(call):
        kg.gm.graph.call_function(operator.getitem, (call, 0))
    with pytest.raises(RuntimeError, match="used before it has been defined"):
        verify(kg)


def test_symbolic_float_scalar_is_rejected():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    graph = fx.Graph()
    x, a = graph.placeholder("x"), graph.placeholder("a")
    mul = graph.call_function(aten.mul.Tensor, (x, a))
    graph.output(mul)
    x.meta["val"], mul.meta["val"] = torch.empty(3), torch.empty(3)
    a.meta["val"] = ShapeEnv().create_unbacked_symfloat()
    with pytest.raises(LoweringError, match="symbolic float/bool scalars are not supported yet: node 'mul_tensor'"):
        lower(fx.GraphModule({}, graph))


def test_verify_rejects_getitem_past_the_outputs():
    kg = _lowered()
    getitem = next(n for n in kg.gm.graph.nodes if n.target is operator.getitem and n.args[0].target in kg.kernels)
    getitem.args = (getitem.args[0], 5)
    with pytest.raises(ValueError, match=r"node buf0 uses the result of kernel0, which is a tuple of 2 outputs"):
        verify(kg)


@pytest.mark.parametrize("fn", [lambda x: x.max(-1), lambda x: x.min(-1)])
def test_max_min_over_an_empty_dim_are_left_to_eager_which_raises(fn):
    # (amax/amin/argmax refuse it while tracing already; max.dim/min.dim reach loopir)
    x = torch.randn(3, 0)
    with pytest.raises(IndexError):
        fn(x)
    with pytest.raises(LoweringError, match="reduces over an empty dim, which eager refuses with an IndexError"):
        lower(_trace_without_running(fn, x))


def _trace_without_running(fn, x):
    """make_fx in fake mode: eager's own check does not run while tracing."""
    return make_fx(fn, tracing_mode="fake")(x)


def test_any_all_over_an_empty_dim_still_lower():
    x = torch.zeros(3, 0, dtype=torch.bool)
    kg = lower(make_fx(lambda x: (x.any(-1), x.all(-1)))(x))
    any_, all_ = kg(x)
    assert not any_.any() and all_.all()
