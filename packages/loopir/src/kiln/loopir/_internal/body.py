"""Loop bodies as data: a body's ops, recorded once, replayed on any handler.

A lowering writes a body as a Python function against an ops handler (`inner_fn`). Running
that function again for every handler (analysis, printing, evaluation, each codegen) repeats
the lowering's Python work and leaves nothing to compare or hash. So `record` runs it once,
on a `_Recorder` handler, in the body's own index variables (``i0, i1, ...`` and
``r0, r1, ...``), and keeps what it did as a `LoopBody`: a tuple of `Instr` in SSA order,
instruction k defining value ``t<k>``. `LoopBody.replay(ops, index, rindex)` calls the same
ops on another handler, with the index variables replaced by the expressions the handler runs
the body at and each recorded `indirect_indexing` symbol by the one that handler returns.

A `LoopBody` is a value: equal bodies compare equal and hash alike (constants compare by type
and exact value, so ``-0.0`` is not ``0.0`` and NaN equals NaN), which is what makes kernels
keys of caches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from .ops import OPS, OpsHandler
from .sizes import Expr, index_vars


@dataclasses.dataclass(frozen=True, slots=True)
class Ref:
    """The value instruction `n` of a body defined."""

    n: int

    def __str__(self) -> str:
        return f"t{self.n}"


@dataclasses.dataclass(frozen=True, slots=True)
class Constant:
    """A Python scalar given to `ops.constant`; equal only to the same type and exact value."""

    value: bool | int | float

    def _key(self) -> tuple[str, str]:
        return type(self.value).__name__, repr(self.value)  # repr tells -0.0 from 0.0; nan == nan

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constant) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return repr(self.value)


@dataclasses.dataclass(frozen=True, slots=True)
class Instr:
    """One op call: its name and arguments (`Ref`s for values, sympy expressions for indices
    and sizes, `Constant`s, dtypes, buffer names and reduction types)."""

    op: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.op}({', '.join(_arg_text(a) for a in self.args)})"


def _arg_text(arg: Any) -> str:
    if isinstance(arg, torch.dtype):
        return str(arg).removeprefix("torch.")
    if isinstance(arg, tuple):
        return "(" + ", ".join(_arg_text(a) for a in arg) + ")"
    return str(arg)


@dataclasses.dataclass(frozen=True, slots=True)
class LoopBody:
    """A recorded loop body over `n_index` index and `n_rindex` reduction variables; `result`
    is the value it computes (a pair of `Ref`s for argmax/argmin: value and position)."""

    instrs: tuple[Instr, ...]
    result: Any
    n_index: int
    n_rindex: int = 0

    def replay(self, ops: Any, index: Sequence[Expr], rindex: Sequence[Expr] = ()) -> Any:
        """Run the body on `ops` at `index`/`rindex`; returns the handler's result value."""
        variables = (*index_vars(self.n_index), *index_vars(self.n_rindex, "r"))
        given = (*index, *rindex)
        if len(given) != len(variables):
            raise ValueError(f"loop body over {self.n_index} index and {self.n_rindex} reduction variables "
                             f"run at {len(index)} and {len(rindex)}")
        mapping = {v: sympy.sympify(e) for v, e in zip(variables, given) if v != e}
        values: list[Any] = []
        indirect = 0

        def arg(a: Any) -> Any:
            if isinstance(a, Ref):
                return values[a.n]
            if isinstance(a, Constant):
                return a.value
            if isinstance(a, sympy.Basic):
                return a.xreplace(mapping) if mapping else a
            if isinstance(a, tuple):
                return tuple(arg(x) for x in a)
            return a

        for instr in self.instrs:
            value = getattr(ops, instr.op)(*(arg(a) for a in instr.args))
            if instr.op == "indirect_indexing":
                mapping[_recorded_indirect(indirect)] = value
                indirect += 1
            values.append(value)
        return arg(self.result)

    def __str__(self) -> str:
        lines = [f"t{k} = {instr}" for k, instr in enumerate(self.instrs)]
        return "\n".join(lines + [f"return {_arg_text(self.result)}"])


def _recorded_indirect(k: int) -> sympy.Symbol:
    """What the recorder returns for the k-th `indirect_indexing`: a name no handler uses."""
    return sympy.Symbol(f"_ind{k}", integer=True)


class _Recorder(OpsHandler):
    """Records every op call as an `Instr`; values are `Ref`s to the instruction defining them."""

    def __init__(self) -> None:
        self.instrs: list[Instr] = []
        self.indirect = 0

    def _add(self, op: str, args: tuple[Any, ...]) -> Ref:
        self.instrs.append(Instr(op, tuple(_normalized(a) for a in args)))
        return Ref(len(self.instrs) - 1)

    def __getattr__(self, name: str) -> Any:
        if name not in OPS:
            return super().__getattr__(name)

        def op(*args: Any) -> Ref:
            return self._add(name, args)

        op.__name__ = name
        return op

    def constant(self, value: Any, dtype: torch.dtype) -> Ref:
        return self._add("constant", (Constant(value), dtype))

    def indirect_indexing(self, value: Any, size: Expr) -> sympy.Symbol:
        self._add("indirect_indexing", (value, size))
        self.indirect += 1
        return _recorded_indirect(self.indirect - 1)


def _normalized(arg: Any) -> Any:
    if isinstance(arg, (Ref, Constant, str, torch.dtype, sympy.Basic)):
        return arg
    if isinstance(arg, tuple):
        return tuple(_normalized(a) for a in arg)
    if isinstance(arg, bool) or arg is None:
        return arg
    if isinstance(arg, int):  # an index or size given as a Python int
        return sympy.Integer(arg)
    if isinstance(arg, float):
        return Constant(arg)
    raise TypeError(f"loop body passed {arg!r} ({type(arg).__name__}) to an op; bodies may pass values, "
                    "index expressions, dtypes, names and constants only")


def record(inner_fn: Callable[..., Any], n_index: int, n_rindex: int | None = None) -> LoopBody:
    """Run `inner_fn` once on a recorder: ``inner_fn(ops, index)`` for a pointwise body
    (`n_rindex` None), ``inner_fn(ops, index, rindex)`` for a reduction's."""
    recorder = _Recorder()
    index = index_vars(n_index)
    if n_rindex is None:
        result = inner_fn(recorder, index)
    else:
        result = inner_fn(recorder, index, index_vars(n_rindex, "r"))
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], (int, sympy.Basic)):
        result = (result[0], sympy.sympify(result[1]))  # a scatter body: (value, flat index to store at)
    elif not (isinstance(result, Ref) or (isinstance(result, tuple) and all(isinstance(r, Ref) for r in result))):
        raise TypeError(f"loop body returned {result!r}, not a value computed with ops")
    return LoopBody(tuple(recorder.instrs), result, n_index, n_rindex or 0)
