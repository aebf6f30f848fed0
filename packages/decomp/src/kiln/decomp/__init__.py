"""kiln.decomp: decomposition tables as immutable data, and a retracing decompose pass.

ATen IR in, a smaller ATen opset out, by a table the caller chooses::

    from kiln.decomp import loop_level, decompose, opset
    gm2 = decompose(gm, loop_level())
"""

from ._internal.builtin_tables import core_aten, loop_level
from ._internal.casts import fold_exact_casts
from ._internal.cse import eliminate_common_subexpressions
from ._internal.opset_check import OpsetError, check_opset, opset
from ._internal.opsets import EXTERN_OPS, LOOP_LEVEL_OPS, OUTSIDE_OPSET
from ._internal.retrace import decompose
from ._internal.table import DecompTable, register
from ._internal.verify import VerifyError, verify

__all__ = [
    "EXTERN_OPS",
    "LOOP_LEVEL_OPS",
    "OUTSIDE_OPSET",
    "DecompTable",
    "OpsetError",
    "VerifyError",
    "check_opset",
    "core_aten",
    "decompose",
    "eliminate_common_subexpressions",
    "fold_exact_casts",
    "loop_level",
    "opset",
    "register",
    "verify",
]
