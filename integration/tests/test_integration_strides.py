"""Stride-aware differential test: OpInfo ops on channels-last, transposed and permuted inputs,
compiled by kiln, give eager's values and eager's significant strides
(`torch._prims_common.check_significant_strides`), on the reference evaluator, the C++ codegen
and the Triton codegen under Triton's interpreter (a smaller slice: its interpreter is slow).

The ops are OpInfos of torch's database, each called as its kind is called: unary ufuncs on
one input (with the scalar arguments of the OpInfo's first sample), binary ufuncs on two inputs
of the same layout, of another layout and broadcast, reductions over a middle dim, the last dim
and all dims (keepdim or not), and `*_like` / `new_*` creation ops (values not compared for empty
and random ones: only their layout). CI runs the representative sample of CI_OPS; the samples of one
layout are one compiled graph (one C++ translation unit), so a run costs a few compiles.
``KILN_STRIDES=full`` runs every unary, binary and reduction OpInfo whose op loopir lowers, the
reductions kiln decomposes (var, std, nansum, ...) and every `*_like` / `new_*` op.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._prims_common import check_significant_strides

from kiln import loopir
from kiln.integration import explain

pytest.importorskip("expecttest", reason="torch's op_db needs expecttest (pip install expecttest)")
os.environ.setdefault("TRITON_INTERPRET", "1")

FULL = os.environ.get("KILN_STRIDES", "") == "full"
SHAPE = (2, 3, 4, 5)  # every dim > 1 and distinct, so every stride is significant

# OpInfo names by kind: a representative sample (CI) of each kind.
CI_OPS = {
    "unary": ("exp", "sigmoid", "abs", "sqrt", "tanh", "floor", "isnan", "nn.functional.silu", "logical_not"),
    "binary": ("add", "mul", "div.no_rounding_mode", "maximum", "atan2", "eq", "remainder", "copysign"),
    "reduction": ("sum", "amax", "mean", "prod", "argmax", "any", "var"),
    "like": ("empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "clone"),
}
TRITON_OPS = {"unary": ("exp", "sigmoid"), "binary": ("add", "maximum"), "reduction": ("sum", "amax"),
              "like": ("zeros_like", "empty_like", "clone")}
UNCOMPARED_VALUES = frozenset({"empty_like", "rand_like", "randn_like", "randint_like", "new_empty", "empty_strided"})


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def transposed(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def permuted(t: torch.Tensor) -> torch.Tensor:
    return t.permute(2, 0, 3, 1).contiguous().permute(1, 3, 0, 2)


LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "channels_last": channels_last, "transposed": transposed, "permuted": permuted}


@functools.cache
def opinfos() -> dict[str, Any]:
    from torch.testing._internal.common_methods_invocations import op_db

    return {f"{o.name}.{o.variant_test_name}" if o.variant_test_name else o.name: o for o in op_db}


# Reduction OpInfos kiln compiles through its decompositions (their ATen op is not loopir's),
# and those without a keepdim argument.
DECOMPOSED_REDUCTIONS = ("var", "std", "nansum", "nanmean", "linalg.vector_norm", "count_nonzero")
NO_KEEPDIM = frozenset({"count_nonzero"})
# `*_like` and `new_*` creation ops: (function of x, its extra arguments).
LIKE_CALLS: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    **{name: (getattr(torch, name), ()) for name in (
        "empty_like", "zeros_like", "ones_like", "rand_like", "randn_like", "clone")},
    "full_like": (torch.full_like, (2.5,)), "randint_like": (torch.randint_like, (10,)),
    **{name: (getattr(torch.Tensor, name), (SHAPE[1:],)) for name in ("new_zeros", "new_ones", "new_empty")},
    "new_full": (torch.Tensor.new_full, (SHAPE[1:], 1.5)),
}


def full_sweep() -> dict[str, tuple[str, ...]]:
    """Every unary, binary and reduction OpInfo named after an op loopir lowers, the reductions
    kiln decomposes, and every `*_like`/`new_*` creation op."""
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, UnaryUfuncInfo

    packets = {op.overloadpacket.__name__ for op in loopir.supported_ops()}
    kinds = {"unary": UnaryUfuncInfo, "binary": BinaryUfuncInfo, "reduction": ReductionOpInfo}
    chosen = {kind: tuple(name for name, o in opinfos().items() if type(o) is cls and o.aten_name in packets
                          and torch.float32 in o.supported_dtypes("cpu"))
              for kind, cls in kinds.items()}
    chosen["reduction"] += DECOMPOSED_REDUCTIONS
    return {**chosen, "like": tuple(LIKE_CALLS)}


def scalar_arguments(opinfo: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The non-tensor arguments of the OpInfo's first sample (a unary op's exponent, ...)."""
    sample = next(iter(opinfo.sample_inputs("cpu", torch.float32)))
    keep = [a for a in sample.args if not isinstance(a, torch.Tensor)]
    return tuple(keep), {k: v for k, v in sample.kwargs.items() if not isinstance(v, torch.Tensor)}


def calls(kind: str, name: str) -> list[tuple[str, Callable[..., Any]]]:
    """(label, fn(x, y)) for each way a `kind` op is called here."""
    op = opinfos()[name].op
    if kind == "unary":
        args, kwargs = scalar_arguments(opinfos()[name])
        return [(name, lambda x, y: op(x, *args, **kwargs))]
    if kind == "binary":
        return [(f"{name}(same layout)", lambda x, y: op(x, y)),
                (f"{name}(contiguous other)", lambda x, y: op(x, y.contiguous())),
                (f"{name}(broadcast row)", lambda x, y: op(x, y[:, :, :1, :].contiguous()))]
    if kind == "reduction":
        keepdim = [] if name in NO_KEEPDIM else [(f"{name}(dim=1, keepdim)", lambda x, y: op(x, dim=1, keepdim=True))]
        return [*keepdim,
                (f"{name}(dim=-1)", lambda x, y: op(x, dim=-1)),
                (f"{name}(dim=2)", lambda x, y: op(x, dim=2)),
                (f"{name}()", lambda x, y: op(x))]
    like, extra = LIKE_CALLS[name]  # torch's functions: rand_like's OpInfo wraps it in one Dynamo skips
    return [(name, lambda x, y: like(x, *extra))]


def cases(ops: dict[str, tuple[str, ...]]) -> list[tuple[str, Callable[..., Any]]]:
    return [case for kind, names in ops.items() for name in names for case in calls(kind, name)]


def inputs(layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.rand(SHAPE) * 0.8 + 0.1  # inside every unary op's domain (log, sqrt, atanh, ...)
    y = torch.rand(SHAPE) * 0.8 + 0.6
    return LAYOUTS[layout](x), LAYOUTS[layout](y)


def run_compiled(fns: list[tuple[str, Callable[..., Any]]], args: tuple[Any, ...], codegen: str,
                 dynamic: bool = False) -> tuple[Any, Any]:
    """The compiled outputs of every fn, in one graph, and the kiln report of its compile."""
    outputs: list[Any] = []

    def every_case(*a: Any) -> None:
        outputs.append(tuple(fn(*a) for _, fn in fns))

    torch._dynamo.reset()
    if dynamic:
        for t in args:
            torch._dynamo.mark_dynamic(t, 0)
    report = explain(every_case, *args, options={"fallback": False, "codegen": codegen})
    assert report.kernel_count >= 1 and not report.fallback_nodes and not report.eager_graphs, str(report)
    assert report.graph_count == 1, str(report)  # one graph: no break hid a case from kiln
    return outputs[0], report


def compare(fns: list[tuple[str, Callable[..., Any]]], got: tuple[Any, ...], args: tuple[Any, ...]) -> list[str]:
    """What differs from eager: each case's label, with its values or strides."""
    mismatches = []
    for (label, fn), g in zip(fns, got):
        expected = fn(*args)
        g_list = g if isinstance(g, tuple) else (g,)
        e_list = expected if isinstance(expected, tuple) else (expected,)
        for g_t, e_t in zip(g_list, e_list):
            if label.split("(")[0] not in UNCOMPARED_VALUES:
                try:
                    torch.testing.assert_close(g_t, e_t, equal_nan=True)
                except AssertionError as exc:
                    mismatches.append(f"{label}: values differ: {str(exc).splitlines()[0]}")
            if not check_significant_strides(g_t, e_t, only_cuda=False)[0]:
                mismatches.append(f"{label}: strides {g_t.stride()}, eager {e_t.stride()} (shape {tuple(e_t.shape)})")
    return mismatches


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_ops_keep_eagers_values_and_strides(codegen, layout):
    fns = cases(full_sweep() if FULL else CI_OPS)
    args = inputs(layout)
    got, _ = run_compiled(fns, args, codegen)
    assert not compare(fns, got, args)


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_ops_keep_eagers_values_and_strides_on_triton(layout):
    fns = cases(TRITON_OPS)
    args = inputs(layout)
    got, _ = run_compiled(fns, args, "cuda")
    assert not compare(fns, got, args)


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_dynamic_shapes_keep_eagers_strides(layout):
    # symbolic sizes give symbolic strides: the layout is ordered by the example's sizes and
    # checked to be dense in that order at every size
    fns = cases({"unary": ("exp",), "binary": ("add",), "reduction": ("sum",), "like": ("ones_like",)})
    args = inputs(layout)
    got, _ = run_compiled(fns, args, "cpu", dynamic=True)
    assert not compare(fns, got, args)


def test_decomposed_ops_outputs_keep_the_layout_of_the_op():
    # eager's softmax of a channels-last tensor is contiguous; its decomposition (exp / sum)
    # would follow the input's layout
    x = inputs("channels_last")[0]
    fns = [("softmax", lambda x: torch.softmax(x, 1)), ("log_softmax", lambda x: torch.log_softmax(x, -1))]
    got, _ = run_compiled(fns, (x,), "cpu")
    assert not compare(fns, got, (x,))


@pytest.mark.parametrize("codegen", ["cpu", "reference"])
def test_empty_strided_keeps_its_exact_strides(codegen):
    fns = [("empty_strided dense", lambda x: torch.empty_strided((4, 5), (1, 4)).fill_(1.5) + x),
           ("zeros of a strided", lambda x: torch.zeros_like(torch.empty_strided((4, 5), (1, 4))) + x),
           ("new_empty_strided", lambda x: x.new_empty_strided((4, 5), (1, 4)).fill_(2.0)),
           ("empty_strided(with gaps)", lambda x: torch.empty_strided((4, 5), (8, 1))),
           ("empty_strided(with gaps, transposed)", lambda x: torch.empty_strided((4, 5), (1, 6)))]
    x = torch.rand(4, 5).t().contiguous().t()
    got, _ = run_compiled(fns, (x,), codegen)
    assert not compare(fns, got, (x,))


class _ConvBlock(torch.nn.Module):
    """The channels-last row of `tools/bench.py`: convolution, batch norm, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


@pytest.mark.parametrize("training", [True, False])
def test_channels_last_conv_block_keeps_its_layout_and_runs_vector_code(training):
    torch.manual_seed(0)
    block = _ConvBlock().to(memory_format=torch.channels_last).train(training)
    x = torch.randn(4, 16, 10, 10).contiguous(memory_format=torch.channels_last)
    torch._dynamo.reset()
    report = explain(block, x, options={"fallback": False, "codegen": "cpu"})
    assert report.kernel_count >= 1 and set(report.fallback_ops) <= {"aten.convolution.default", "aten.copy_.default"}
    expected_block = _ConvBlock().to(memory_format=torch.channels_last).train(training)
    expected_block.load_state_dict(block.state_dict())  # explain ran it once (running statistics)
    with torch.no_grad():
        got = torch.compile(block, backend="kiln", options={"fallback": False})(x)
        expected = expected_block(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert got.stride() == expected.stride() == x.stride()
    torch.testing.assert_close(block.bn.running_var, expected_block.bn.running_var)
    # C innermost: the batch statistics reduce along the channels (vector lanes); in eval mode the
    # per-channel scale is computed before the N, H, W loops (in training its own kernel has it)
    assert ("vacc_" in report.source) == training
    assert training or "computed before the loops" in report.source
