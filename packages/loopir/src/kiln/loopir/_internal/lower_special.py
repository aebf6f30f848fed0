"""Lowerings of the torch.special pointwise family and of searches (bucketize, searchsorted),
written as loop bodies over loopir's existing ops (issue 20).

The functions live in one module per family, each with its own table, merged here:

* `lower_special_bessel`: i0/i0e/i1/i1e, modified Bessel functions (I, K, scaled K), Bessel
  functions of the first and second kind, spherical j0;
* `lower_special_gamma`: digamma, polygamma, zeta;
* `lower_special_igamma`: the regularized incomplete gamma functions igamma and igammac;
* `lower_special_normal`: ndtri, erfcx, log_ndtr;
* `lower_special_polynomial`: orthogonal polynomials of a degree given as a number;
* `lower_special_search`: searchsorted and bucketize, binary searches unrolled in the loop body.

Special functions that torch decomposes (sinc, entr, xlogy, xlog1py, logit, ndtr,
multigammaln) reach loopir as ops it lowers elsewhere; xlogy and xlog1py of a number make
that number a tensor with `prims.scalar_tensor`, lowered here as `aten.scalar_tensor` is.
"""

from __future__ import annotations

import torch

from . import (
    lower_special_bessel,
    lower_special_gamma,
    lower_special_igamma,
    lower_special_normal,
    lower_special_polynomial,
    lower_special_search,
)
from .lower_pointwise import lower_full
from .registry import Lowerings

_SCALAR_TENSOR = Lowerings()
_SCALAR_TENSOR.register("constant", torch.ops.prims.scalar_tensor.default)(lower_full)

TABLE: Lowerings = (lower_special_bessel.TABLE | lower_special_gamma.TABLE | lower_special_igamma.TABLE
                    | lower_special_normal.TABLE | lower_special_polynomial.TABLE | lower_special_search.TABLE
                    | _SCALAR_TENSOR)
