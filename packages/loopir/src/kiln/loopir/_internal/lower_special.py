"""Lowerings of the torch.special pointwise family and of searches (bucketize, searchsorted),
written as loop bodies over loopir's existing ops (issue 20).

The functions live in one module per family, each with its own table, merged here:

* `lower_special_bessel`: i0/i0e/i1/i1e, modified Bessel functions (I, K, scaled K), Bessel
  functions of the first and second kind, spherical j0;
* `lower_special_gamma`: digamma, polygamma, zeta;
* `lower_special_normal`: ndtri, erfcx, log_ndtr;
* `lower_special_search`: searchsorted and bucketize, binary searches unrolled in the loop body.
"""

from __future__ import annotations

from . import lower_special_bessel, lower_special_gamma, lower_special_normal, lower_special_search
from .registry import Lowerings

TABLE: Lowerings = (lower_special_bessel.TABLE | lower_special_gamma.TABLE | lower_special_normal.TABLE
                    | lower_special_search.TABLE)
