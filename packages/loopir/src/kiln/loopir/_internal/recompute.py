"""Which values read by several users are recomputed by each user instead of stored once
(`LowerOptions.recompute_cheap`, `LowerOptions.recompute_transcendental`).

A value read by several users is stored once and loaded by each, unless it is cheap: at most
`CHEAP_LOADS` loads and `CHEAP_OPS` other ops, none of them random or indirect. Then each user
computes it again, which moves fewer bytes: a cast of a bfloat16 tensor to float32 read by the
three loops of a log-softmax was a float32 copy written once and read three times.

Without `recompute_transcendental` only arithmetic is recomputed (`ARITHMETIC`: adds, products,
divisions, comparisons, selects, casts): a compute-bound target (C++ on a CPU, where a vector
exp costs tens of cycles) keeps a softmax's ``exp`` a buffer computed once, while a batch norm's
centred input ``x - sum / n``, read by the variance and by the output, is recomputed and never
stored.

A value that two or more users need in memory (extern calls such as matmuls, the graph's output,
directly or through views) is stored once whatever its cost (`stored_uses`): recomputed, each of
them would write its own copy, a transposed one for a view (an MLP backward's gradient, read by
the input-gradient matmul and, transposed, by the weight-gradient matmul, was written twice).

On a memory-bound target (`recompute_transcendental`), a value none of whose loads depends on its
innermost index (each load is the same along a whole row: a broadcast of per-row values, such as
nll_loss's backward one-hot `where(i1 == label[i0], -scale[i0], 0)`) is recomputed with up to
`BROADCAST_OPS` ops, whatever its number of loads: recomputed, it costs arithmetic on values
loaded once per row; stored, a write and a read of every element (a language model's output
layer gradient is tokens x vocabulary: 1 GB at 8192 tokens of 30522 float32 logits). Rows of at
least `BROADCAST_MIN_WIDTH` elements only, where a load per row is small against the row.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy
import torch.fx as fx

from .body import record
from .ops import RANDOM
from .shared.op_costs import ARITHMETIC
from .sizes import index_vars
from .values import Lazy

CHEAP_LOADS, CHEAP_OPS = 3, 6
BROADCAST_OPS, BROADCAST_MIN_WIDTH = 32, 64
NEVER_RECOMPUTED = frozenset({"indirect_indexing", *RANDOM})


def recomputed_on_reuse(value: Lazy, transcendental: bool = True) -> bool:
    """Whether `value` (a lowered node with several users) stays an index function that each
    user evaluates, instead of a buffer (module docstring); with `transcendental` False, only
    when every op of its body is `ARITHMETIC`."""
    try:
        instrs = record(value.inner_fn, len(value.size)).instrs
    except Exception:  # noqa: BLE001 - a body that does not record alone is realized, as before
        return False
    if any(i.op in NEVER_RECOMPUTED for i in instrs):
        return False
    work = sum(i.op not in ("load", "constant", "to_dtype") for i in instrs)
    if transcendental and work <= BROADCAST_OPS and _broadcast_along_rows(instrs, value.size):
        return True
    loads = sum(i.op == "load" for i in instrs)
    if loads > CHEAP_LOADS or work > CHEAP_OPS:
        return False
    return transcendental or all(i.op in ARITHMETIC for i in instrs)


def _broadcast_along_rows(instrs, size) -> bool:
    """Whether no load of a body over `size` depends on its innermost index, along which it
    spans at least `BROADCAST_MIN_WIDTH` elements (or a symbolic number)."""
    if not size:
        return False
    width = sympy.sympify(size[-1])
    if width.is_number and width < BROADCAST_MIN_WIDTH:
        return False
    inner = index_vars(len(size))[-1]
    return all(inner not in sympy.sympify(i.args[1]).free_symbols for i in instrs if i.op == "load")


def stored_uses(node: fx.Node, kind_of: Callable[[fx.Node], str | None]) -> int:
    """How many users of `node` need it in memory: the graph's output, an extern call, or a view
    (`kind_of(user) == "view"`, followed through further views) that one of those reads. Each
    would store its own copy of a recomputed value (a view's in the view's layout); `kind_of`
    gives a user's lowering kind ("extern", "view", ...; None for an op without lowering)."""

    def stored(user: fx.Node, depth: int = 0) -> bool:
        if user.op == "output" or kind_of(user) == "extern":
            return True
        return kind_of(user) == "view" and depth < 8 and any(stored(u, depth + 1) for u in user.users)

    return sum(stored(user) for user in node.users)
