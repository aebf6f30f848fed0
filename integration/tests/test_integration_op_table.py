"""One OpInfo-driven differential table: loopir's ATen ops x dtypes x {loopir's reference
evaluator, codegen_cpp, codegen_triton on Triton's interpreter}, each against eager.

Samples come from torch's OpInfo database: every OpInfo named after an op of
`loopir.supported_ops()` (its name, ATen name or an alias), and those of EXTRA_OPINFOS. A sample
is traced with make_fx, decomposed with `decomp.loop_level()` when its graph holds ops loopir
does not lower, and joins the table when every op and dtype of the result is one loopir lowers
and eager runs it. Outputs that are views are cloned in the traced function, so that a kernel
reads through the view. Outputs are compared with eager: dtype, shape and values (NaNs equal;
dtype and shape only for the uninitialized memory `empty*` returns).

Cost: the samples of one dtype are merged into one graph, lowered once and compiled once per
codegen (one C++ translation unit). Each sample is also lowered alone (the reference
evaluator's run), so a sample loopir fails on is known before any compile; when a batch's
compile or run raises, it is split in halves until the failing samples stand alone, so a
failure names its op. CI runs, for each OpInfo and dtype, the samples that join the table and
trace to an op no earlier one did (the first, then the first of each other overload; every
sample of a known failure); ``KILN_OP_TABLE=full`` (``nox -s op_table``) runs them all.

int8, uint8 and int16 run for the few OpInfos of SMALL_INT_OPINFOS only (CI time).

Known failures are strict xfails (XFAIL, per OpInfo, dtype and backend).
`test_every_supported_op_is_covered` checks each op of `supported_ops()` ran and matched eager
on each backend, for some dtype; the few ops no OpInfo reaches are in NO_OPINFO, with why, and
run hand-written samples (HAND_WRITTEN) in the same table.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from kiln import codegen_cpp, codegen_triton, decomp, loopir

pytest.importorskip("expecttest", reason="torch's op_db needs expecttest (pip install expecttest)")
# Triton kernels run on CPU tensors through Triton's interpreter; it is read when kernels are
# defined, so setting it here holds even when op_db's import has imported triton already.
os.environ.setdefault("TRITON_INTERPRET", "1")

aten = torch.ops.aten

DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16, torch.float16)
BACKENDS = ("reference", "cpp", "triton")
# int8/uint8/int16 for a few OpInfos only (every op x 3 more dtypes would cost CI minutes):
# wrapping arithmetic, division, shifts, reductions, a scan and a scatter.
SMALL_INTS = (torch.int8, torch.uint8, torch.int16)
SMALL_INT_OPINFOS = frozenset({"add", "sub", "mul", "neg", "abs", "bitwise_xor", "bitwise_left_shift",
                               "div.floor_rounding", "remainder", "maximum", "sum", "amax", "cumsum", "scatter_add"})
FULL = os.environ.get("KILN_OP_TABLE", "") == "full"

# (rtol, atol) by output dtype: torch's defaults for assert_close, but float16's two units in the
# last place (1e-3 is one): loopir rounds a low-precision result once, where eager may round an
# intermediate too (sub's alpha * other). Integers and bools exact.
TOLERANCES = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7), torch.bfloat16: (1.6e-2, 1e-5),
              torch.float16: (2e-3, 1e-5)}

# OpInfos whose names are no supported op's, sampled for the supported ops they trace to.
EXTRA_OPINFOS = {
    "__getitem__": "index.Tensor, its index a lifted tensor constant (lift_fresh_copy)",
    "to": "_to_copy between dtypes",
    "double": "_to_copy to float64",
    "long": "_to_copy to int64",
    "int": "_to_copy to int32",
    "bool": "_to_copy to bool",
    "alias_copy": "alias (loop_level decomposes alias_copy to alias + clone)",
    "kron": "_unsafe_view (make_fx reshapes its non-contiguous product with a copy)",
    "nn.functional.avg_pool1d": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.max_pool1d": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.max_pool2d": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.max_pool3d": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.adaptive_avg_pool1d": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.adaptive_avg_pool2d": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.adaptive_avg_pool3d": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.adaptive_max_pool1d": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.adaptive_max_pool2d": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.adaptive_max_pool3d": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.interpolate.nearest": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.interpolate.nearest-exact": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.upsample_nearest": "window reductions (pooling, adaptive pooling, nearest upsampling)",
    "nn.functional.embedding_bag": "_embedding_bag_forward_only (its bags: a search and a scatter)",
}

# Overloads taking a number where their OpInfo's samples have a tensor: make_fx records
# add.Tensor for `x + 2`, so only explicit calls and decompositions reach add.Scalar. The
# samples run again calling the overload, the operand replaced by its first element as a
# number (table entries `OpInfo[overload]`).
SCALAR_OVERLOADS = {
    aten.add.Scalar: "add", aten.sub.Scalar: "sub", aten.mul.Scalar: "mul", aten.div.Scalar: "div.no_rounding_mode",
    aten.div.Scalar_mode: "div.floor_rounding", aten.eq.Scalar: "eq", aten.ne.Scalar: "ne", aten.lt.Scalar: "lt",
    aten.le.Scalar: "le", aten.gt.Scalar: "gt", aten.ge.Scalar: "ge", aten.bitwise_and.Scalar: "bitwise_and",
    aten.bitwise_or.Scalar: "bitwise_or", aten.bitwise_xor.Scalar: "bitwise_xor", aten.fmod.Scalar: "fmod",
    aten.remainder.Scalar: "remainder", aten.copysign.Scalar: "copysign", aten.pow.Tensor_Scalar: "pow",
    aten.pow.Scalar: "pow",
}

_BACKWARD_ONLY = "OpInfo samples trace forward only; backward ops appear in training graphs"

# Ops of supported_ops() that no OpInfo sample traces to, and why; HAND_WRITTEN samples run them.
NO_OPINFO = {
    aten.sym_size.int: "sizes are graph values only in symbolic traces; OpInfo samples trace with real shapes",
    aten.sym_stride.int: "strides are graph values only in symbolic traces",
    aten.sym_numel.default: "numel is a graph value only in symbolic traces",
    aten.reshape.default: "make_fx decomposes reshape to view/_unsafe_view while tracing, so only a renamed "
                          "node reaches loopir's reshape lowering",
    aten.detach.default: "no OpInfo calls detach (make_fx records it only for an explicit call)",
    aten.avg_pool2d_backward.default: _BACKWARD_ONLY,
    aten.avg_pool3d_backward.default: _BACKWARD_ONLY,
    aten.max_pool3d_with_indices_backward.default: _BACKWARD_ONLY,
    aten._adaptive_avg_pool2d_backward.default: _BACKWARD_ONLY,
    aten._adaptive_avg_pool3d_backward.default: _BACKWARD_ONLY,
    aten.adaptive_max_pool2d_backward.default: _BACKWARD_ONLY,
    aten.adaptive_max_pool3d_backward.default: _BACKWARD_ONLY,
    aten.upsample_nearest1d_backward.default: _BACKWARD_ONLY,
    aten.upsample_nearest2d_backward.default: _BACKWARD_ONLY,
    aten.upsample_nearest3d_backward.default: _BACKWARD_ONLY,
    aten._upsample_nearest_exact1d_backward.default: _BACKWARD_ONLY,
    aten._upsample_nearest_exact2d_backward.default: _BACKWARD_ONLY,
    aten._upsample_nearest_exact3d_backward.default: _BACKWARD_ONLY,
}

# Ops loopir lowers whose OpInfos the table does not select yet (their samples need the table's
# special-function and scalar-overload handling): tested on the reference evaluator, C++ and
# Triton by integration/tests/test_integration_special.py and loopir's test_loopir_special.py.
_SPECIAL_ELSEWHERE = "test_integration_special.py / test_loopir_special.py (the table does not select its OpInfo yet)"
TESTED_ELSEWHERE = {op: _SPECIAL_ELSEWHERE for op in (
    aten.bucketize.Scalar, aten.special_bessel_j0.default, aten.special_bessel_j1.default,
    aten.special_bessel_y0.default, aten.special_bessel_y1.default,
    aten.special_chebyshev_polynomial_t.n_scalar, aten.special_chebyshev_polynomial_u.n_scalar,
    aten.special_chebyshev_polynomial_v.n_scalar, aten.special_chebyshev_polynomial_w.n_scalar,
    aten.special_hermite_polynomial_h.n_scalar, aten.special_hermite_polynomial_he.n_scalar,
    aten.special_laguerre_polynomial_l.n_scalar, aten.special_legendre_polynomial_p.n_scalar,
    aten.special_modified_bessel_i0.default, aten.special_modified_bessel_i1.default,
    aten.special_modified_bessel_k0.default, aten.special_modified_bessel_k1.default,
    aten.special_scaled_modified_bessel_k0.default, aten.special_scaled_modified_bessel_k1.default,
    aten.special_shifted_chebyshev_polynomial_t.n_scalar, aten.special_shifted_chebyshev_polynomial_u.n_scalar,
    aten.special_shifted_chebyshev_polynomial_v.n_scalar, aten.special_shifted_chebyshev_polynomial_w.n_scalar,
    aten.special_spherical_bessel_j0.default, aten.special_zeta.default, aten.special_zeta.other_scalar,
    aten.special_zeta.self_scalar, torch.ops.prims.scalar_tensor.default)}
# Fractional max pooling's OpInfo samples draw their own random samples (no sample joins the table):
# test_integration_fractional_pool.py (C++ and Triton, forward and a training step) and
# test_loopir_pooling_fractional.py (the reference evaluator) pass them explicitly.
TESTED_ELSEWHERE |= dict.fromkeys(
    (aten.fractional_max_pool2d.default, aten.fractional_max_pool3d.default),
    "test_integration_fractional_pool.py / test_loopir_pooling_fractional.py (OpInfo samples are random)")

# Attention backward ops are extern calls (loopir lower_attention.py) with no OpInfo of their own:
# test_integration_attention_externs.py runs them in training steps (forward and backward externs,
# gradients against eager, on the CPU and on a GPU).
TESTED_ELSEWHERE |= dict.fromkeys(
    (aten._scaled_dot_product_flash_attention_backward.default,
     aten._scaled_dot_product_flash_attention_for_cpu_backward.default),
    "test_integration_attention_externs.py (training steps through the attention externs)")

# Random ops draw from kiln's generator (loopir's philox.py), not eager's, so no value can match:
# integration/tests/test_integration_random.py checks them by statistics, reproducibility for a
# seed, equal draws on every codegen and forward/backward mask agreement.
RANDOM_OPS = frozenset(op for op in loopir.supported_ops() if torch.Tag.nondeterministic_seeded in op.tags)

# Samples loopir refuses by design (its README's "Not yet"): they do not join the table.
DOCUMENTED_LIMITS = {
    r"with a torch\.bool index is not lowered": "index.Tensor with a boolean mask (data-dependent size)",
}

_EMPTY_OUTPUT = ("codegen_triton: an output with a size-0 dim ({}) raises ZeroDivisionError "
                 "('Modulo by zero') in loopir's simplify_index while the kernel is generated")
_POW_ACCURACY = ("codegen_triton: float32 pow as exp(y * log|x|) is 11-12 ulp off for large results (relative error "
                 "1.37e-6 to 1.48e-6, eager's is within 1 ulp)")
_INT_EXPONENT = ("codegen_triton: pow with an integer tensor exponent is refused at launch (a tl.static_assert; "
                 "its README's 'Not yet')")
_INT_ARANGE = ("loopir: arange.start_step with an integer dtype: bool bounds raise TypeError (BooleanAtom), "
               "fractional bounds give trunc(start + i * step) where eager gives int(start) + i * int(step) "
               "(arange(2.1, -2.9, -1.0) is [2, 1, 0, 0], eager [2, 1, 0, -1])")
_BF16_COMPARE = ("codegen_triton: bfloat16 comparisons compare the loaded bfloat16 values, not upcast to float32 "
                 "as loopir's low-precision rule says; in Triton's interpreter the results are wrong")
_FLOATS = ("float32", "float64", "bfloat16", "float16")


def _each(names: Sequence[str], dtypes: Sequence[str], backend: str, reason: str) -> dict[tuple[str, str, str], str]:
    return {(name, dtype, backend): reason for name in names for dtype in dtypes}


# (OpInfo name, dtype or "*", backend or "*") -> why it fails. Strict: one that passes fails.
XFAIL: dict[tuple[str, str, str], str] = {
    ("arange", "int64", "*"): _INT_ARANGE,
    ("arange", "int32", "*"): _INT_ARANGE,
    ("div.trunc_rounding", "bfloat16", "triton"):
        "Triton's interpreter converts float32 to bfloat16 by truncation: the quotient eager rounds to bfloat16 "
        "before truncating (53.9 -> 54) comes out one bfloat16 ulp low (53.75 -> 53)",
    ("pow", "float32", "triton"): _POW_ACCURACY,
    ("pow[Scalar]", "float32", "triton"): _POW_ACCURACY,
    **_each(["pow", "pow[Scalar]"], ["int64", "int32"], "triton", _INT_EXPONENT),
    ("flip", "*", "triton"): _EMPTY_OUTPUT.format("flip of [5, 0, 10]"),
    ("constant_pad_nd", "*", "triton"): _EMPTY_OUTPUT.format("padding [5, 3] by (-1, -2, 1, 1) to [7, 0]"),
    ("nn.functional.pad.constant", "*", "triton"): _EMPTY_OUTPUT.format("padding [5, 3] to [7, 0]"),
    **_each(["ge", "gt", "le", "lt", "ge[Scalar]", "gt[Scalar]", "le[Scalar]", "lt[Scalar]"], ["bfloat16"],
            "triton", _BF16_COMPARE),
    ("arange", "bfloat16", "triton"):
        "codegen_triton: arange in bfloat16 converts its float64 values straight to bfloat16, which gives NaN "
        "in Triton's interpreter",
}


@dataclasses.dataclass(frozen=True)
class HandWritten:
    """A sample for ops no OpInfo reaches: `fn` on a random [3, 4] tensor of each of `dtypes`."""

    fn: Callable[..., Any]
    dtypes: tuple[torch.dtype, ...]
    tracing_mode: str = "real"
    retarget: tuple[tuple[Any, Any], ...] = ()  # (traced op, op it becomes) after tracing

    def inputs(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        return ((torch.randn(3, 4) * 5).to(dtype),)


def _sizes_in_graph(a):
    return a * a.shape[0] + a.stride(0) - a.numel()


def _g2(a):
    return a[None, None, :2, :3]


def _x2(a):
    return a[None, None] * 1


def _g3(a):
    return a[None, None, None, :2, :3]


def _x3(a):
    return a[None, None, None] * 1


_F3 = (torch.float32, torch.float64, torch.bfloat16)
_F2 = (torch.float32, torch.float64)
# Backward ops of window reductions on a [3, 4] sample (their grads [2, 3]).
_POOLING_BACKWARD = {
    "hand:avg_pool2d_backward": HandWritten(
        lambda a: aten.avg_pool2d_backward(_g2(a), _x2(a), [2, 2], [1, 1], [0, 0], False, True, None), _F3),
    "hand:avg_pool3d_backward": HandWritten(
        lambda a: aten.avg_pool3d_backward(_g3(a), _x3(a), [1, 2, 2], [1, 1, 1], [0, 0, 0], False, True, None), _F2),
    "hand:max_pool3d_with_indices_backward": HandWritten(
        lambda a: aten.max_pool3d_with_indices_backward(
            _g3(a), _x3(a), [1, 2, 2], [1, 1, 1], [0, 0, 0], [1, 1, 1], False,
            aten.max_pool3d_with_indices(_x3(a), [1, 2, 2], [1, 1, 1])[1]), _F2),
    "hand:_adaptive_avg_pool2d_backward": HandWritten(lambda a: aten._adaptive_avg_pool2d_backward(_g2(a), _x2(a)), _F3),
    "hand:_adaptive_avg_pool3d_backward": HandWritten(lambda a: aten._adaptive_avg_pool3d_backward(_g3(a), _x3(a)), _F3),
    "hand:adaptive_max_pool2d_backward": HandWritten(
        lambda a: aten.adaptive_max_pool2d_backward(_g2(a), _x2(a), aten.adaptive_max_pool2d(_x2(a), [2, 3])[1]), _F3),
    "hand:adaptive_max_pool3d_backward": HandWritten(
        lambda a: aten.adaptive_max_pool3d_backward(_g3(a), _x3(a), aten.adaptive_max_pool3d(_x3(a), [1, 2, 3])[1]),
        _F3),
    **{f"hand:{prefix}1d_backward": HandWritten(
        lambda a, p=prefix: getattr(aten, f"{p}1d_backward")(a[None], [4], [1, 3, 3], None), _F3)
       for prefix in ("upsample_nearest", "_upsample_nearest_exact")},
    **{f"hand:{prefix}2d_backward": HandWritten(
        lambda a, p=prefix: getattr(aten, f"{p}2d_backward")(a[None, None], [3, 4], [1, 1, 2, 3], None, None), _F3)
       for prefix in ("upsample_nearest", "_upsample_nearest_exact")},
    **{f"hand:{prefix}3d_backward": HandWritten(
        lambda a, p=prefix: getattr(aten, f"{p}3d_backward")(a[None, None, None], [1, 3, 4], [1, 1, 1, 2, 3], None,
                                                              None, None), _F3)
       for prefix in ("upsample_nearest", "_upsample_nearest_exact")},
}

HAND_WRITTEN = {
    "hand:sym_sizes": HandWritten(_sizes_in_graph, (torch.float32, torch.int64), tracing_mode="symbolic"),
    "hand:reshape": HandWritten(lambda a: (a.view(2, 6), (a * 2).view(4, 3)), DTYPES,
                                retarget=((aten.view.default, aten.reshape.default),)),
    "hand:detach": HandWritten(lambda a: aten.detach.default(a * 2) + 1, (torch.float32, torch.int64)),
    **_POOLING_BACKWARD,
}


# --------------------------------------------------------------------------- samples


def opinfo_name(opinfo: Any) -> str:
    return f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name


@functools.cache
def selected_opinfos() -> dict[str, Any]:
    """OpInfo name -> OpInfo: those named after a supported op, and EXTRA_OPINFOS."""
    from torch.testing._internal.common_methods_invocations import op_db

    packets = {op.overloadpacket.__name__ for op in loopir.supported_ops() - RANDOM_OPS}
    chosen = {}
    for opinfo in op_db:
        names = {opinfo.name, opinfo.aten_name, *(alias.name for alias in opinfo.aliases)}
        if names & packets or opinfo_name(opinfo) in EXTRA_OPINFOS:
            chosen[opinfo_name(opinfo)] = opinfo
    return chosen


@functools.cache
def scalar_variants() -> dict[str, tuple[Any, Any]]:
    """Table name -> (OpInfo, overload) of SCALAR_OVERLOADS."""
    return {f"{name}[{overload._overloadname}]": (selected_opinfos()[name], overload)
            for overload, name in SCALAR_OVERLOADS.items()}


def table_names() -> list[str]:
    return [*selected_opinfos(), *scalar_variants(), *HAND_WRITTEN]


def opinfo_of(name: str) -> Any:
    return scalar_variants()[name][0] if name in scalar_variants() else selected_opinfos()[name]


def table_dtypes(name: str) -> tuple[torch.dtype, ...]:
    if name in HAND_WRITTEN:
        return HAND_WRITTEN[name].dtypes
    extra = SMALL_INTS if name in SMALL_INT_OPINFOS else ()
    return tuple(dt for dt in (*DTYPES, *extra) if dt in opinfo_of(name).supported_dtypes("cpu"))


def backend_dtypes(backend: str) -> frozenset[torch.dtype]:
    """The dtypes a backend takes: loopir's, less those its codegen's capabilities lack."""
    codegen = {"reference": loopir.REFERENCE_CODEGEN, "cpp": codegen_cpp.CODEGEN, "triton": codegen_triton.CODEGEN}
    return codegen[backend].capabilities.dtypes & loopir.SUPPORTED_DTYPES


@dataclasses.dataclass(eq=False)
class Sample:
    """One sample of one op: `fn(*tensors)` runs it in eager, `gm` is its ATen graph."""

    op: str
    index: int
    dtype: torch.dtype
    fn: Callable[..., Any]
    tensors: tuple[torch.Tensor, ...]
    gm: fx.GraphModule
    expected: list[Any]
    symbolic: bool = False

    @property
    def label(self) -> str:
        return f"{self.op} [{str(self.dtype).removeprefix('torch.')} sample {self.index}]"

    @functools.cached_property
    def ops(self) -> frozenset[Any]:
        return frozenset(n.target for n in self.gm.graph.nodes if n.op == "call_function") - {operator.getitem}

    @functools.cached_property
    def dtypes(self) -> frozenset[torch.dtype]:
        return frozenset(_graph_dtypes(self.gm))

    @functools.cached_property
    def uninitialized(self) -> bool:
        return bool(self.ops & {aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default})

    @functools.cached_property
    def lowered(self) -> loopir.KernelGraph | Exception:
        """The sample's own kernel graph, verified, or what lowering it raised."""
        try:
            kernel_graph = loopir.lower(self.gm)
            loopir.verify(kernel_graph)
        except Exception as err:
            return err
        lowerings = loopir.default_lowerings()
        computes = {op for op in self.ops if lowerings[op].kind in ("pointwise", "reduction", "constant")}
        if computes and not kernel_graph.kernels:  # it must not pass by running only externs and views
            return AssertionError(f"no kernel generated for {sorted(map(str, computes))}")
        return kernel_graph


def _sample_function(op: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]
                     ) -> tuple[Callable[..., Any], list[torch.Tensor]]:
    """(fn, tensors): fn(*tensors) calls `op(*args, **kwargs)` with `tensors` swapped in."""
    leaves, spec = pytree.tree_flatten((list(args), kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def fn(*values: torch.Tensor) -> Any:
        filled = list(leaves)
        for i, value in zip(positions, values):
            filled[i] = value
        call_args, call_kwargs = pytree.tree_unflatten(filled, spec)
        return op(*call_args, **call_kwargs)

    return fn, [leaves[i] for i in positions]


def _sample_call(name: str, sample: Any) -> tuple[Callable[..., Any], list[torch.Tensor]] | str:
    """What one OpInfo sample calls, for the table entry `name`; or why it has no call."""
    if name not in scalar_variants():
        return _sample_function(selected_opinfos()[name].op, [sample.input, *sample.args], sample.kwargs)
    overload = scalar_variants()[name][1]
    position = next(i for i, arg in enumerate(overload._schema.arguments) if isinstance(arg.type, torch.NumberType))
    args = [sample.input, *sample.args]
    if position >= len(args) or isinstance(args[position], torch.Tensor) and not args[position].numel():
        return "no operand to pass as a number"
    if isinstance(args[position], torch.Tensor):
        args[position] = args[position].reshape(-1)[0].item()
    return _sample_function(overload, args, sample.kwargs)


def materialized(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with each output that is a view (or an input) cloned, so that a kernel reads
    through the view instead of the graph returning a strided view of an input."""
    def traced(*tensors: torch.Tensor) -> Any:
        def clone_view(out: Any) -> Any:
            if isinstance(out, torch.Tensor) and (out._is_view() or any(out is t for t in tensors)):
                return aten.clone.default(out)
            return out
        return pytree.tree_map(clone_view, fn(*tensors))
    return traced


def trace(fn: Callable[..., Any], tensors: Sequence[torch.Tensor], tracing_mode: str = "real",
          retarget: tuple[tuple[Any, Any], ...] = ()) -> fx.GraphModule | None:
    """The ATen graph loopir gets: make_fx, then `loop_level()` where needed. None when ops
    outside `supported_ops()`, or dtypes loopir refuses, remain."""
    gm = make_fx(materialized(fn), tracing_mode=tracing_mode)(*tensors)
    if retarget:
        for node in gm.graph.nodes:
            node.target = dict(retarget).get(node.target, node.target)
        gm.recompile()
    if not _lowerable_ops(gm):
        gm = decomp.decompose(gm, _loop_level())
    return gm if _lowerable_ops(gm) and _graph_dtypes(gm) <= loopir.SUPPORTED_DTYPES else None


def _lowerable_ops(gm: fx.GraphModule) -> bool:
    supported = loopir.supported_ops()
    return all(n.target in supported or n.target is operator.getitem
               for n in gm.graph.nodes if n.op == "call_function")


def _graph_dtypes(gm: fx.GraphModule) -> set[torch.dtype]:
    values = pytree.tree_leaves([n.meta.get("val") for n in gm.graph.nodes])
    return {v.dtype for v in values if isinstance(v, torch.Tensor)}


@functools.cache
def _loop_level() -> Any:
    return decomp.loop_level()


def _clone(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


def _short(err: BaseException, limit: int = 300) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:limit]}"


def _make_sample(name: str, index: int, dtype: torch.dtype, fn: Callable[..., Any],
                 tensors: Sequence[torch.Tensor], tracing_mode: str = "real",
                 retarget: tuple[tuple[Any, Any], ...] = ()) -> Sample | str:
    """A Sample, or why this one cannot join the table."""
    if not all(t.layout == torch.strided and t.device.type == "cpu" for t in tensors):
        return "not a dense CPU tensor"
    try:
        expected = pytree.tree_leaves(fn(*_clone(tensors)))
    except Exception as err:  # eager refuses the sample: not the table's concern
        return f"eager raised {type(err).__name__}"
    try:
        gm = trace(fn, tensors, tracing_mode, retarget)
    except Exception as err:
        return f"make_fx/decompose raised {_short(err, 100)}"
    if gm is None:
        return "holds ops or dtypes loopir does not lower"
    return Sample(name, index, dtype, fn, tuple(tensors), gm, expected, tracing_mode == "symbolic")


class _RecordOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))


def _eager_ops(fn: Callable[..., Any], tensors: Sequence[torch.Tensor]) -> set[Any]:
    """The ATen ops eager calls for `fn(*tensors)` (what make_fx would mostly record), or an
    empty set when eager raises."""
    recorder, inputs = _RecordOps(), _clone(tensors)
    try:
        with recorder:
            fn(*inputs)
    except Exception:
        return set()
    return recorder.ops


def _documented_limit(sample: Sample) -> str | None:
    if isinstance(sample.lowered, loopir.LoweringError):
        for pattern, why in DOCUMENTED_LIMITS.items():
            if re.search(pattern, str(sample.lowered)):
                return why
    return None


def _samples_of(name: str, dtype: torch.dtype, every: bool) -> tuple[list[Sample], list[str]]:
    """The samples of one op for `dtype` that join the table, and why others cannot. Unless
    `every`, only those that trace to an op, or pass a keyword, that no earlier one of the list
    did: the first, then the first of each other overload (sum.dim_IntList after sum.default)
    and keyword (alpha, keepdim, ...)."""
    torch.manual_seed(0)  # sample values are random
    if name in HAND_WRITTEN:
        hand = HAND_WRITTEN[name]
        made = _make_sample(name, 0, dtype, hand.fn, hand.inputs(dtype), hand.tracing_mode, hand.retarget)
        return ([made], []) if isinstance(made, Sample) else ([], [made])
    opinfo = opinfo_of(name)
    samples, reasons, seen = [], [], set()
    traced: set[frozenset[Any]] = set()  # eager ops + keywords of each sample traced already
    # sample_inputs_func, not sample_inputs: that one inspects the stack for every sample
    for index, sample in enumerate(opinfo.sample_inputs_func(opinfo, "cpu", dtype, False)):
        call = _sample_call(name, sample)
        keywords = {f"keyword {key}" for key in sample.kwargs}
        if not (every or isinstance(call, str)):
            # checked before tracing: most samples are left out here, and make_fx is slow. A
            # sample calling what a traced one called brings nothing new either (eager may call
            # ops the traced graph never holds: max_pool2d's backward sample has 1440 of those)
            signature = frozenset(_eager_ops(*call) | keywords)
            if signature <= seen or signature in traced:
                continue
            traced.add(signature)
        made = call if isinstance(call, str) else _make_sample(name, index, dtype, *call)
        if isinstance(made, Sample) and not (every or (made.ops | keywords) - seen):
            continue
        if isinstance(made, Sample) and (limit := _documented_limit(made)):
            made = limit
        if isinstance(made, str):
            reasons.append(made)
        else:
            samples.append(made)
            seen |= made.ops | keywords
    return samples, reasons


# --------------------------------------------------------------------------- comparison


def compare(sample: Sample, got: Sequence[Any]) -> str | None:
    """None when `got` (one sample's output leaves) matches eager; else what differs."""
    want = sample.expected
    if len(got) != len(want):
        return f"{len(got)} outputs, eager has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if not isinstance(w, torch.Tensor):
            if g != w:
                return f"output {i}: got {g!r}, eager {w!r}"
            continue
        if not isinstance(g, torch.Tensor):
            return f"output {i}: got {type(g).__name__}, eager a tensor"
        if g.dtype != w.dtype or g.shape != w.shape:
            return f"output {i}: got {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}"
        if sample.uninitialized:
            continue
        rtol, atol = TOLERANCES.get(w.dtype, (0, 0))
        try:
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as err:
            return f"output {i}: {' '.join(str(err).split())[:500]}"
    return None


# --------------------------------------------------------------------------- backends


@dataclasses.dataclass(frozen=True)
class Outcome:
    sample: Sample
    problem: str | None  # None: matched eager


def run_reference(sample: Sample) -> Outcome:
    """loopir alone: call the sample's KernelGraph, whose kernels run on the reference evaluator."""
    if isinstance(sample.lowered, Exception):
        return Outcome(sample, _short(sample.lowered))
    try:
        got = pytree.tree_leaves(sample.lowered(*_clone(sample.tensors)))
    except Exception as err:
        return Outcome(sample, _short(err))
    return Outcome(sample, compare(sample, got))


def merge(samples: Sequence[Sample]) -> tuple[fx.GraphModule, list[slice]]:
    """One graph computing every sample, inputs and outputs concatenated in order; returns it
    and the slice of its outputs that belongs to each sample."""
    root, graph = torch.nn.Module(), fx.Graph()
    outputs: list[Any] = []
    spans = []
    for i, sample in enumerate(samples):
        env: dict[fx.Node, fx.Node] = {}
        for node in sample.gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = graph.placeholder(f"s{i}_{node.name}")
            elif node.op == "get_attr":
                setattr(root, f"s{i}_{node.target}", getattr(sample.gm, node.target))
                env[node] = graph.get_attr(f"s{i}_{node.target}")
            elif node.op == "output":
                leaves = [env[v] if isinstance(v, fx.Node) else v for v in pytree.tree_leaves(node.args[0])]
                spans.append(slice(len(outputs), len(outputs) + len(leaves)))
                outputs += leaves
                continue
            else:
                env[node] = graph.node_copy(node, env.__getitem__)
            env[node].meta = dict(node.meta)
    graph.output(tuple(outputs))
    return fx.GraphModule(root, graph), spans


class Codegen:
    """Compiles batches of samples with one codegen, runs them, compares with eager."""

    def __init__(self, name: str, options: Any) -> None:
        self.name, self.options = name, options

    def build(self, kernel_graph: loopir.KernelGraph) -> fx.GraphModule:
        """The compiled module; every loopir kernel became a generated one."""
        if self.name == "cpp":
            module = codegen_cpp.compile(kernel_graph, self.options)
            codegen_cpp.verify(module)
            generated = module.meta["kiln_cpp"].source.count('extern "C" void')
        else:
            module = codegen_triton.compile(kernel_graph, self.options)
            codegen_triton.verify(module)
            generated = len(module.meta["kiln_triton"].kernels)
        if generated != len(kernel_graph.kernels):
            raise AssertionError(f"{generated} generated kernels for {len(kernel_graph.kernels)} loopir kernels")
        return module

    def generate(self, kernel_graph: loopir.KernelGraph) -> None:
        (codegen_cpp if self.name == "cpp" else codegen_triton).generate(kernel_graph, self.options)

    def _generation_error(self, sample: Sample) -> Exception | None:
        try:
            self.generate(sample.lowered)
        except Exception as err:
            return err
        return None

    def run(self, samples: Sequence[Sample], known_to_fail: bool = False) -> list[Outcome]:
        """Samples loopir fails on fail here too; the others run as batches (a symbolic
        trace's sizes are its own: such a sample runs alone). Known failures first generate
        source one sample at a time (no compile): what fails there never makes a batch halve."""
        failed = [Outcome(s, _short(s.lowered)) for s in samples if isinstance(s.lowered, Exception)]
        ready = [s for s in samples if not isinstance(s.lowered, Exception)]
        if known_to_fail:
            errors = {id(s): self._generation_error(s) for s in ready}
            failed += [Outcome(s, _short(errors[id(s)])) for s in ready if errors[id(s)] is not None]
            ready = [s for s in ready if errors[id(s)] is None]
        alone = [[s] for s in ready if s.symbolic]
        batch = [s for s in ready if not s.symbolic]
        return failed + [o for group in [*alone, batch] if group for o in self._run_batch(group)]

    def _run_batch(self, samples: Sequence[Sample]) -> list[Outcome]:
        """Compile and run `samples` as one graph; when that raises, halve until it is one
        sample's exception."""
        try:
            gm, spans = merge(samples)
            kernel_graph = loopir.lower(gm)
            module = self.build(kernel_graph)
            got = pytree.tree_leaves(module(*(t for s in samples for t in _clone(s.tensors))))
        except Exception as err:
            if len(samples) == 1:
                return [Outcome(samples[0], _short(err))]
            half = len(samples) // 2
            return self._run_batch(samples[:half]) + self._run_batch(samples[half:])
        return [Outcome(s, compare(s, got[span])) for s, span in zip(samples, spans)]


def xfail_reason(name: str, dtype: torch.dtype, backend: str) -> str | None:
    dt = str(dtype).removeprefix("torch.")
    for key in ((name, dt, backend), (name, "*", backend), (name, dt, "*"), (name, "*", "*")):
        if key in XFAIL:
            return XFAIL[key]
    return None


class Table:
    """The table's samples and outcomes, each computed once per dtype (and backend)."""

    def __init__(self, cache_dir: Any) -> None:
        self.codegens = {
            "cpp": Codegen("cpp", codegen_cpp.CppOptions(cache_dir=cache_dir / "cpp")),
            # small blocks: tensors span several programs, reductions loop over several chunks
            "triton": Codegen("triton", codegen_triton.TritonOptions(
                cache_dir=cache_dir / "triton", xblock=16, reduction_xblock=4, rblock=8, contiguous_rblock=8)),
        }
        self._samples: dict[torch.dtype, tuple[dict[str, list[Sample]], dict[str, list[str]]]] = {}
        self._outcomes: dict[tuple[str, torch.dtype], dict[str, list[Outcome]]] = {}
        self._known: dict[tuple[str, torch.dtype, str], list[Outcome]] = {}

    def samples(self, dtype: torch.dtype) -> tuple[dict[str, list[Sample]], dict[str, list[str]]]:
        """op -> its samples of `dtype` in the table; op -> why the others are left out."""
        if dtype not in self._samples:
            samples, left_out = {}, {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for name in table_names():
                    if dtype in table_dtypes(name):
                        # a known failure runs every sample: the failing one may not come first
                        every = FULL or any(xfail_reason(name, dtype, backend) for backend in BACKENDS)
                        samples[name], left_out[name] = _samples_of(name, dtype, every)
            self._samples[dtype] = samples, left_out
        return self._samples[dtype]

    def runnable(self, backend: str, dtype: torch.dtype) -> dict[str, list[Sample]]:
        """op -> its samples of `dtype` that `backend` runs: a sample holding a dtype the backend
        lacks (a float32 `to(bfloat16)` on C++) sits out."""
        return {name: [s for s in samples if s.dtypes <= backend_dtypes(backend)]
                for name, samples in self.samples(dtype)[0].items()}

    def outcomes(self, backend: str, dtype: torch.dtype) -> dict[str, list[Outcome]]:
        """op -> the outcome of each of its samples of `dtype` on `backend`."""
        if (backend, dtype) not in self._outcomes:
            by_op = self.runnable(backend, dtype)
            known = [name for name in by_op if xfail_reason(name, dtype, backend)]
            rest = [s for name, samples in by_op.items() if name not in known for s in samples]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results = self._run(backend, rest) + [o for name in known for o in self._known_failure(backend, dtype, name)]
            outcomes: dict[str, list[Outcome]] = {name: [] for name in by_op}
            for outcome in results:
                outcomes[outcome.sample.op].append(outcome)
            self._outcomes[backend, dtype] = outcomes
        return self._outcomes[backend, dtype]

    def _run(self, backend: str, samples: list[Sample], apart: bool = False) -> list[Outcome]:
        if backend == "reference":
            return [run_reference(s) for s in samples]
        return self.codegens[backend].run(samples, apart)

    def _known_failure(self, backend: str, dtype: torch.dtype, name: str) -> list[Outcome]:
        """Outcomes of a known failure's samples, compiled apart: it never sends the big batch
        into halving, and the coverage check runs it without the rest of the dtype."""
        if (backend, dtype, name) not in self._known:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._known[backend, dtype, name] = self._run(backend, self.runnable(backend, dtype)[name], True)
        return self._known[backend, dtype, name]

    def covered_ops(self, backend: str, opinfo_only: bool = False) -> set[Any]:
        """Ops of the samples that match eager on `backend` (of OpInfo samples only).

        Every table entry that is not a known failure asserts that all its samples match
        (`test_op_matches_eager`), so their ops count without running them here: with the
        entries spread over xdist workers by dtype, this test then builds samples, not every
        dtype's compiled batches again. Known failures' samples run, and count where they match."""
        covered: set[Any] = set()
        for dtype in backend_dtypes(backend) & {*DTYPES, *SMALL_INTS}:
            for name, samples in self.runnable(backend, dtype).items():
                if opinfo_only and name in HAND_WRITTEN:
                    continue
                if xfail_reason(name, dtype, backend):
                    samples = [o.sample for o in self._known_failure(backend, dtype, name) if o.problem is None]
                covered.update(*(s.ops for s in samples))
        return covered


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    return Table(tmp_path_factory.mktemp("op_table"))


# --------------------------------------------------------------------------- tests


def _params():
    for name in table_names():
        for dtype in table_dtypes(name):
            for backend in BACKENDS:
                marks = []
                if dtype not in backend_dtypes(backend):
                    marks.append(pytest.mark.skip(reason=f"low precision: issue 13 ({backend} lacks {dtype})"))
                elif reason := xfail_reason(name, dtype, backend):
                    marks.append(pytest.mark.xfail(strict=True, reason=reason))
                # One xdist worker per dtype (`--dist loadgroup`): the table's samples and
                # compiled batches of a dtype are built once, not on every worker.
                marks.append(pytest.mark.xdist_group(f"op_table_{str(dtype).removeprefix('torch.')}"))
                yield pytest.param(name, dtype, backend, marks=marks,
                                   id=f"{name}-{str(dtype).removeprefix('torch.')}-{backend}")


@pytest.mark.parametrize(("name", "dtype", "backend"), list(_params()))
def test_op_matches_eager(table: Table, name: str, dtype: torch.dtype, backend: str):
    outcomes = table.outcomes(backend, dtype)[name]
    if not outcomes:
        reasons = set(table.samples(dtype)[1][name])
        if table.samples(dtype)[0][name]:
            reasons.add(f"every sample holds a dtype {backend} lacks")
        pytest.skip(f"no sample joins the table: {'; '.join(sorted(reasons)) or 'no samples'}")
    failures = [f"{o.sample.label}: {o.problem}" for o in outcomes if o.problem]
    assert not failures, "\n".join(failures)


def test_every_supported_op_is_covered(table: Table):
    """Each op loopir lowers ran and matched eager on every backend, for some dtype; the ops
    only hand-written samples reach are those of NO_OPINFO, no more, no fewer."""
    supported = loopir.supported_ops() - RANDOM_OPS - set(TESTED_ELSEWHERE)
    if stale := set(TESTED_ELSEWHERE) - loopir.supported_ops():
        raise AssertionError(f"TESTED_ELSEWHERE lists ops loopir does not lower: {sorted(map(str, stale))}")
    problems = []
    for backend in BACKENDS:
        covered, by_opinfo = table.covered_ops(backend), table.covered_ops(backend, opinfo_only=True)
        if missing := supported - covered:
            problems.append(f"{backend}: no passing sample runs {sorted(map(str, missing))}")
        if unexempt := (supported & covered) - by_opinfo - set(NO_OPINFO):
            problems.append(f"{backend}: only hand-written samples run {sorted(map(str, unexempt))}: "
                            "find an OpInfo, or list them in NO_OPINFO with why")
        if stale := set(NO_OPINFO) & by_opinfo:
            problems.append(f"{backend}: NO_OPINFO lists ops OpInfo samples run: {sorted(map(str, stale))}")
    if unknown := set(NO_OPINFO) - supported:
        problems.append(f"NO_OPINFO lists ops loopir does not lower: {sorted(map(str, unknown))}")
    assert not problems, "\n".join(problems)


def test_xfail_and_extra_opinfos_name_real_items():
    items = {(name, str(dtype).removeprefix("torch."), backend)
             for name in table_names() for dtype in table_dtypes(name) for backend in BACKENDS}
    stale = [key for key in XFAIL if not any(all(k in ("*", v) for k, v in zip(key, item)) for item in items)]
    assert not stale, f"XFAIL entries that name no item of the table: {stale}"
    unknown = [name for name in EXTRA_OPINFOS if name not in selected_opinfos()]
    assert not unknown, f"EXTRA_OPINFOS names no OpInfo of op_db: {unknown}"
