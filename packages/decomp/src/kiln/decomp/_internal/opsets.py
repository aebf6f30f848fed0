"""LOOP_LEVEL_OPS: the ATen opset that ``loop_level()`` targets, in named groups.

``decompose(gm, loop_level())`` rewrites a graph towards this set; an op of the set is
never decomposed by ``loop_level()``. Ops that neither the set nor the table covers stay
in the graph as they are (partition sends them to eager); ``check_opset`` finds them.

Two kinds of ops make up the set:

* **loop ops** (``LOOP_OPS``), which a loop-level IR expresses as loop bodies: pointwise
  math (each a libm / libdevice call or a few arithmetic ops), reductions, views (index
  functions), indexing (gather / scatter as indirect loads and stores), ``cat`` and
  padding, creation (``full``, ``arange`` as the iota, uninitialised ``empty``), type
  conversion, and window reductions (pooling, adaptive pooling, nearest upsampling and
  their backward ops);
* **externs** (``EXTERN_OPS``), which stay whole and are called as library kernels:
  matrix products, convolution, attention, sorting and scans, linear algebra, FFT,
  random-number generation, ops with data-dependent output shapes, pooling / resampling
  kernels torch has no loop form for, special functions with no libm counterpart,
  complex-number and sparse ops. ``EXTERN_GROUPS`` names each group.

loopir lowers a subset of this set today (``kiln.loopir.supported_ops()``); the others
reach the backend whole and run eagerly until loopir learns them.
"""

from __future__ import annotations

import logging

import torch
from torch._ops import OpOverload

from .ops import aten_overloads

log = logging.getLogger(__name__)

_POINTWISE = (
    # arithmetic
    "add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar",
    "mul.Tensor", "mul.Scalar", "div.Tensor", "div.Scalar", "div.Tensor_mode",
    "div.Scalar_mode", "neg", "abs", "reciprocal", "fmod.Tensor", "fmod.Scalar",
    "remainder.Tensor", "remainder.Scalar", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "maximum", "minimum", "fmax", "fmin", "copysign.Tensor", "copysign.Scalar",
    "sign", "signbit", "ceil", "floor", "round", "round.decimals", "trunc", "nextafter",
    "ldexp.Tensor", "frexp.Tensor",
    # transcendental (libm / libdevice)
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh",
    "asinh", "acosh", "atanh", "sigmoid", "erf", "erfc", "erfinv", "lgamma", "hypot",
    "relu",
    # comparison, logical, bitwise, selection
    "eq.Tensor", "eq.Scalar", "ne.Tensor", "ne.Scalar", "lt.Tensor", "lt.Scalar",
    "le.Tensor", "le.Scalar", "gt.Tensor", "gt.Scalar", "ge.Tensor", "ge.Scalar",
    "isnan", "isinf", "logical_not", "logical_and", "logical_or", "logical_xor",
    "bitwise_not", "bitwise_and.Tensor", "bitwise_and.Scalar", "bitwise_or.Tensor",
    "bitwise_or.Scalar", "bitwise_xor.Tensor", "bitwise_xor.Scalar",
    "bitwise_left_shift.Tensor", "bitwise_right_shift.Tensor", "where.self",
    "gcd", "lcm",
    # copies and type conversion
    "clone", "_to_copy",
)  # fmt: skip

_CREATION = (
    "full", "scalar_tensor", "arange.start_step", "empty.memory_format", "empty_strided",
    "empty_permuted",
)  # fmt: skip

_REDUCTIONS = (
    "sum.dim_IntList", "sum.default", "prod.dim_int", "prod.default", "mean.dim",
    "mean.default", "amax", "amin", "argmax", "argmin", "max.dim", "min.dim", "max.default",
    "min.default", "any.dim", "any.dims", "any.default", "all.dim", "all.dims", "all.default",
)  # fmt: skip

_VIEWS = (
    "view", "_unsafe_view", "permute", "t", "transpose.int", "expand", "unsqueeze",
    "squeeze.default", "squeeze.dim", "squeeze.dims", "alias", "slice.Tensor", "select.int",
    "diagonal", "as_strided", "unfold",
)  # fmt: skip

_INDEXING = (
    "index.Tensor", "index_put", "gather", "scatter.src", "scatter.value", "scatter.reduce",
    "scatter.value_reduce", "scatter_add", "scatter_reduce.two", "index_select", "flip",
    "index_reduce", "put", "masked_scatter",
    "cat", "constant_pad_nd",
    # functional scatters into a view (what functionalization writes for view mutation)
    "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
)  # fmt: skip

# Window reductions: pooling, adaptive pooling and nearest upsampling, their backward ops
# (a loop-level IR reduces over each window, or gathers over the windows holding an element)
_WINDOWS = (
    "avg_pool2d", "avg_pool3d", "avg_pool2d_backward", "avg_pool3d_backward",
    "max_pool2d_with_indices", "max_pool3d_with_indices", "max_pool2d_with_indices_backward",
    "max_pool3d_with_indices_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d",
    "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d",
    "adaptive_max_pool3d", "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward",
    "fractional_max_pool2d", "fractional_max_pool3d",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "upsample_nearest1d_backward", "upsample_nearest2d_backward", "upsample_nearest3d_backward",
    "_upsample_nearest_exact1d", "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
    "_upsample_nearest_exact1d_backward", "_upsample_nearest_exact2d_backward",
    "_upsample_nearest_exact3d_backward",
)  # fmt: skip

# Ops that stay whole, called as library kernels. Names missing from a torch are skipped.
EXTERN_GROUPS: dict[str, tuple[str, ...]] = {
    "matmul": ("mm", "addmm", "bmm", "_cdist_forward", "_pdist_forward", "_trilinear"),
    "convolution": ("convolution", "convolution_backward"),
    "attention": (
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_attention_math",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    ),
    "sort_and_scan": (
        "sort", "sort.stable", "topk", "cumsum", "cumprod", "cummax", "cummin",
        "logcumsumexp", "kthvalue", "median.default", "median.dim", "nanmedian.default",
        "nanmedian.dim", "mode", "searchsorted.Tensor", "searchsorted.Scalar",
        "bucketize.Tensor",
    ),
    "linalg": (
        "_linalg_svd", "linalg_qr", "linalg_inv_ex", "_linalg_eigh", "_linalg_solve_ex",
        "linalg_lu_factor_ex", "linalg_lu_solve", "linalg_lu", "linalg_cholesky_ex",
        "linalg_eig", "linalg_ldl_factor_ex", "linalg_ldl_solve", "_linalg_slogdet",
        "_linalg_det", "linalg_householder_product", "linalg_solve_triangular",
        "triangular_solve", "cholesky", "cholesky_inverse", "cholesky_solve", "geqrf",
        "ormqr", "lu_unpack", "linalg_matrix_exp", "linalg_pinv.atol_rtol_tensor",
        "_linalg_check_errors",
    ),
    "fft": ("_fft_r2c", "_fft_c2c", "_fft_c2r"),
    "random": (
        "rand", "randn", "randint", "randint.low", "rand_like", "randn_like",
        "randint_like", "randint_like.low_dtype", "bernoulli.p", "bernoulli.default",
        "normal.Tensor_float", "normal.float_Tensor", "normal.Tensor_Tensor",
        "normal.float_float", "normal_functional", "uniform", "exponential", "cauchy",
        "geometric", "log_normal", "multinomial", "randperm",
        "rrelu_with_noise_functional",
    ),
    "data_dependent": (
        "nonzero", "nonzero_static", "_unique2", "unique_dim", "unique_consecutive",
        "masked_select", "_local_scalar_dense", "histc", "bincount",
        "histogram.bin_ct", "histogram.bins_tensor", "_histogramdd_bin_edges",
        "_histogramdd_from_bin_cts", "_histogramdd_from_bin_tensors",
        "repeat_interleave.Tensor", "segment_reduce",
        "_embedding_bag", "_embedding_bag_forward_only",
    ),
    "pooling_and_resampling": (
        "grid_sampler_3d",
        "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa",
    ),
    "special_functions": (
        "digamma", "polygamma", "i0", "igamma", "igammac", "special_i0e", "special_i1",
        "special_i1e", "special_zeta", "special_ndtri", "special_erfcx", "special_airy_ai",
        "special_bessel_j0", "special_bessel_j1", "special_bessel_y0", "special_bessel_y1",
        "special_modified_bessel_i0", "special_modified_bessel_i1",
        "special_modified_bessel_k0", "special_modified_bessel_k1",
        "special_scaled_modified_bessel_k0", "special_scaled_modified_bessel_k1",
        "special_spherical_bessel_j0", "special_chebyshev_polynomial_t",
        "special_chebyshev_polynomial_u", "special_chebyshev_polynomial_v",
        "special_chebyshev_polynomial_w", "special_shifted_chebyshev_polynomial_t",
        "special_shifted_chebyshev_polynomial_u", "special_shifted_chebyshev_polynomial_v",
        "special_shifted_chebyshev_polynomial_w", "special_hermite_polynomial_h",
        "special_hermite_polynomial_he", "special_laguerre_polynomial_l",
        "special_legendre_polynomial_p", "special_log_ndtr", "special_zeta.self_scalar",
        "special_zeta.other_scalar", "bucketize.Scalar",
        *(f"special_{p}.n_scalar" for p in (
            "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
            "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
            "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
            "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p")),
    ),
    "complex": (
        "complex", "polar", "view_as_complex", "view_as_real", "_conj", "_conj_physical",
        "angle",
    ),
    "sparse": ("sparse_sampled_addmm", "_sparse_mm_reduce_impl", "_to_sparse",
               "_to_sparse.sparse_dim"),
}  # fmt: skip

POINTWISE_OPS = aten_overloads(_POINTWISE)
CREATION_OPS = aten_overloads(_CREATION)
REDUCTION_OPS = aten_overloads(_REDUCTIONS)
VIEW_OPS = aten_overloads(_VIEWS)
INDEXING_OPS = aten_overloads(_INDEXING)
WINDOW_OPS = aten_overloads(_WINDOWS)
EXTERN_OPS_BY_GROUP: dict[str, frozenset[OpOverload]] = {
    group: aten_overloads(names) for group, names in EXTERN_GROUPS.items()
}
EXTERN_OPS: frozenset[OpOverload] = frozenset().union(*EXTERN_OPS_BY_GROUP.values())

LOOP_OPS = POINTWISE_OPS | CREATION_OPS | REDUCTION_OPS | VIEW_OPS | INDEXING_OPS | WINDOW_OPS
LOOP_LEVEL_OPS = LOOP_OPS | EXTERN_OPS

# Ops a loop-level consumer (loopir) also accepts although `loop_level()` never leaves them in
# a graph, and why they are outside the opset. The contract test in integration checks that
# every op loopir lowers is in LOOP_LEVEL_OPS or here.
OUTSIDE_OPSET: dict[OpOverload, str] = {
    torch.ops.aten.reshape.default: "decomposed into view (or clone + view); consumers accept it for "
                                    "graphs traced without decomposition",
    torch.ops.aten.detach.default: "decomposed away (an alias without autograd meaning in functional "
                                   "graphs); consumers accept it for graphs traced without decomposition",
    torch.ops.aten.lift_fresh_copy.default: "make_fx's copy of a lifted constant, decomposed into clone",
    torch.ops.aten.sym_size.int: "a size query, not a tensor op: never decomposed, read at run time",
    torch.ops.aten.sym_stride.int: "a stride query, not a tensor op: never decomposed, read at run time",
    torch.ops.aten.sym_numel.default: "an element-count query, not a tensor op: never decomposed",
    torch.ops.aten.full_like.default: "decomposed into full (+ permute to the input's layout) where the "
                                      "layout is static; kept whole when the input's strides are symbolic, "
                                      "and consumers lower it (loopir) with the layout of its FakeTensor",
    torch.ops.prims.scalar_tensor.default: "a number made a tensor by torch's own decompositions of "
                                           "scalar overloads (xlogy, xlog1py); consumers lower it as "
                                           "aten.scalar_tensor",
}
