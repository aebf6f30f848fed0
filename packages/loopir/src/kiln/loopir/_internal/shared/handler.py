"""`TextHandler`: the base of ops handlers that emit source text for one kernel.

What every text-emitting codegen needs, whatever its target:

* values are names of local variables; `var(text)` defines one per distinct expression text
  (common subexpressions are emitted once), in the target's syntax (`statement`);
* scoped CSE: `scope()` forgets the values defined inside a loop once the loop is closed, and
  `capture()` collects the statements of one loop body;
* constants: `constant` emits the target's `literal` and remembers which variable holds which
  constant (`constants`), so ops may special-case them (pow by 2 is a product);
* buffers kept in registers: `store` records the stored value (`locals`) and a later load of
  that buffer in the kernel is that value;
* row temporaries (`Kernel.row_temporaries`): where each is stored, and a check that a load
  of one is at that same place (`row_temporary_index`);
* run-time checks (`add_check`, see `checks.py`), with messages naming the buffer and the ATen
  nodes it comes from;
* op templates: `install_templates` turns ``{"add": "{0} + {1}"}`` into op methods.

A subclass defines `statement`, `literal`, `error`, and the ops its target needs to write
itself (loads and stores with its addressing, reductions, casts, ...).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import sympy
import torch

from ..ir import ComputedBuffer, Kernel
from ..ops import OpsHandler
from .checks import CheckSite


class TextHandler(OpsHandler):
    """Emits one kernel's statements as text (see the module docstring)."""

    statement: ClassVar[str] = "{name} = {text}"  # how `var` defines a variable
    error: ClassVar[type[Exception]] = NotImplementedError  # the codegen's error type
    prefix: ClassVar[str] = "tmp"  # variables are prefix0, prefix1, ...

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.lines: list[str] = []
        self.cache: dict[str, str] = {}  # expression text -> variable holding it
        self.locals: dict[str, str] = {}  # buffer kept in a register -> variable
        self.constants: dict[str, tuple[Any, torch.dtype]] = {}  # variable -> the constant it holds
        self.checks: list[CheckSite] = []  # check number k + 1 is checks[k]
        self.node: ComputedBuffer | None = None  # the node being emitted (messages)
        self.outputs = {o.name for o in kernel.outputs}
        self.produced = {n.name for n in kernel.nodes}
        # row temporary -> (its node, where it is stored in the kernel's variables)
        self.row_temporaries = {n.name: (n, kernel.accesses(n).writes[0].index) for n in kernel.row_temporaries}
        self.loop_body: list[str] | None = None  # a reduction's loop body, once `end_loop_body` closed it
        self._count = 0

    # -- values ------------------------------------------------------------------------------
    def var(self, text: str) -> str:
        """The variable holding `text`, defined here unless an earlier statement in scope did."""
        found = self.cache.get(text)
        if found is not None:
            return found
        name = f"{self.prefix}{self._count}"
        self._count += 1
        self.lines.append(self.statement.format(name=name, text=text))
        self.cache[text] = name
        return name

    def literal(self, value: Any, dtype: torch.dtype) -> str:
        raise NotImplementedError(f"{type(self).__name__} must say how it writes a {dtype} constant")

    def constant(self, value: Any, dtype: torch.dtype) -> str:
        name = self.var(self.literal(value, dtype))
        self.constants[name] = (value, dtype)
        return name

    def constant_value(self, name: str) -> Any:
        """The Python value of the constant variable `name` holds, or None."""
        found = self.constants.get(name)
        return None if found is None else found[0]

    @classmethod
    def install_templates(cls, templates: Mapping[str, str]) -> None:
        """Define op `name` as ``var(template.format(*operands))`` for each entry."""
        for name, template in templates.items():
            def op(self: TextHandler, *args: str, _template: str = template) -> str:
                return self.var(_template.format(*args))

            op.__name__ = name
            setattr(cls, name, op)

    # -- scopes ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self, *, keep_locals: bool = True) -> Iterator[None]:
        """Values defined inside are out of scope after it (a loop's body); with
        ``keep_locals=False`` so are buffers stored inside (a row loop's stores are read back
        from memory after it)."""
        saved_cache, saved_locals = dict(self.cache), dict(self.locals)
        try:
            yield
        finally:
            self.cache = saved_cache
            if not keep_locals:
                self.locals = saved_locals

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[str]]:
        """Collect the statements emitted inside into the list it yields."""
        saved, saved_body = self.lines, self.loop_body
        captured: list[str] = []
        self.lines, self.loop_body = captured, None
        try:
            yield captured
        finally:
            captured[:] = self.lines  # `end_loop_body` may have moved on to a new list
            self.lines, self.loop_body = saved, saved_body

    def end_loop_body(self) -> list[str]:
        """Close a reduction's loop body (called by a `reduction` op): what was emitted so far
        runs once per iteration, what follows after the loop. Returns the body."""
        self.loop_body, self.lines = list(self.lines), []
        return self.loop_body

    # -- buffers -----------------------------------------------------------------------------
    def local(self, name: str) -> str | None:
        """The register holding buffer `name` stored earlier in scope, or None."""
        return self.locals.get(name)

    def keep(self, name: str, value: str) -> bool:
        """Record `value` as buffer `name`'s register; returns whether the buffer is an output
        (and must also be stored to memory)."""
        self.locals[name] = value
        return name in self.outputs

    def pointer(self, name: str) -> str:
        """The parameter a buffer is addressed through: ``out_<name>`` for buffers the kernel
        produces (a row node's is read back by later loops), ``in_<name>`` for inputs."""
        return f"{'out' if name in self.produced else 'in'}_{name}"

    def row_temporary_index(self, name: str, index: sympy.Expr) -> sympy.Expr:
        """Where row temporary `name` is stored; raises when `index` is elsewhere (loopir's
        scheduler fuses loads of one only where it was stored, in the kernel's variables)."""
        stored = self.row_temporaries[name][1]
        if sympy.expand(sympy.sympify(index) - stored) != 0:
            raise self.error(f"{self.kernel.name}, buffer {self.node_name()}: reads row temporary {name} at "
                             f"{index}, but {name} is computed at {stored}; only loads where it is stored can "
                             "read it")
        return stored

    # -- checks and messages -----------------------------------------------------------------
    def node_name(self) -> str:
        return self.node.name if self.node is not None else "?"

    def location(self) -> str:
        """``buffer buf3 (from add_1, mul)``: the node being emitted, for messages."""
        node = self.node
        if node is None:
            return ""
        return f"buffer {node.name}" + (f" (from {', '.join(node.origins)})" if node.origins else "")

    def add_check(self, error: type[Exception], message: str, size: sympy.Expr | None = None) -> int:
        """Register a run-time check of the node being emitted; returns its number (1-based)."""
        where = self.location()
        self.checks.append(CheckSite(error, f"{where}: {message}" if where else message,
                                     None if size is None else sympy.sympify(size)))
        return len(self.checks)
