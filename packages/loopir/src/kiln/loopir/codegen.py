"""loopir's shared codegen layer: what every codegen that emits source text builds on.

* `TextHandler`: an ops-handler base emitting text, with scoped CSE, constants, registers for
  buffers kept in the kernel, row temporaries, run-time checks and op templates;
* `KernelWalker`: runs a kernel's nodes where the scheduler placed them, with pointwise code,
  reduction loops and row loops as context managers;
* `CheckSite` / `raise_failed_check`: the run-time check/status protocol;
* `SizeFunction` / `compile_size` / `evaluate_size`: size expressions evaluated on the host
  without `eval`;
* `ArtifactCache`: the content-hash artifact cache, with atomic writes and verified loads, and
  `default_cache_root()`, its per-user default place;
* `node_summary`: the one-line description of a node codegens put above its code;
* `shared_reduction_loops`: which independent reductions of a kernel one loop computes (rows
  read once for `x.sum(-1), x.amax(-1)`);
* `scatter_bases`: which input a runtime copies into which output before a scatter kernel runs;
* `input_stores`: which input's tensor a runtime passes as which output's storage (a mutated
  graph input the kernel writes in place);
* `layout_guard`: one C++ call telling whether a static kernel's inputs have exactly the
  layouts of the ones it last ran on (a runtime's per-call fast path; its own Python check
  decides whenever the guard says no);
* `check_option_types`: the type check of a codegen's options dataclass;
* `known_nonnegative`: whether an index expression's integer `//` and `%` may round differently
  in C-like languages than in sympy (a dividend not known to be >= 0);
* `ARITHMETIC_OPS`: the ops of a few cycles per element on any target (loads, compares, selects,
  sums, products, divisions, bit ops: no exp, log, sqrt, special functions), as loopir's
  recompute rule counts them; a codegen weighs a loop's work by it;
* `philox`: the definition of the random-number ops (`rand`, `randn`, `randint64`) every
  codegen implements, with its constants and a torch implementation.

kiln's C++ and Triton codegens are built on it; a third-party codegen can be too.
"""

from ._internal import philox
from ._internal.shared.artifacts import ArtifactCache, ArtifactCacheError, default_cache_root
from ._internal.shared.checks import CheckSite, raise_failed_check
from ._internal.shared.handler import TextHandler
from ._internal.shared.host import SizeFunction, compile_size, evaluate_size
from ._internal.shared.layout_guard import LayoutGuard, layout_guard
from ._internal.shared.op_costs import ARITHMETIC as ARITHMETIC_OPS
from ._internal.shared.option_types import check_option_types
from ._internal.shared.reduction_loops import shared_reduction_loops
from ._internal.shared.signs import known_nonnegative
from ._internal.shared.walker import (
    KernelWalker,
    ReductionParts,
    input_stores,
    node_summary,
    scatter_bases,
)

__all__ = [
    "TextHandler", "KernelWalker", "ReductionParts", "CheckSite", "raise_failed_check", "SizeFunction",
    "compile_size", "evaluate_size", "ArtifactCache", "ArtifactCacheError", "default_cache_root", "node_summary",
    "philox", "scatter_bases", "input_stores", "known_nonnegative", "check_option_types", "ARITHMETIC_OPS",
    "layout_guard", "LayoutGuard", "shared_reduction_loops",
]
