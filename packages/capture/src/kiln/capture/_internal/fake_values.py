"""Fake values with symbolic sizes: described for a file, rebuilt in a fresh ``ShapeEnv``.

Saving describes each FakeTensor by its metadata (sizes, strides and storage offset as
expressions, dtype, device, requires_grad, which storage it shares) and each SymInt by its
expression; every symbol goes into one table with its hint, value range and the source
Dynamo gave it (``L['x'].size()[0]``). Loading creates the symbols again, in a new
``ShapeEnv``, from the same source names: torch derives a symbol's name from its source,
so ``s77`` usually comes back as ``s77``. Tensors that shared a storage share one again when
the later one fits in the first one's storage.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from kiln.capture._internal.sympy_codec import decode_expr, encode_expr

log = logging.getLogger(__name__)

SymType = torch.SymInt | torch.SymFloat | torch.SymBool


def is_fake(value: Any) -> bool:
    """A tensor that holds no data: a FakeTensor or a meta tensor."""
    return isinstance(value, FakeTensor) or (isinstance(value, torch.Tensor) and value.is_meta)


class SymbolTable:
    """The symbols met while saving one file, with what is needed to create them again."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}

    def encode_sym(self, value: SymType) -> dict[str, Any]:
        """``{"$": "symint" | "symfloat" | "symbool", "expr": ...}``; records its symbols."""
        node = value.node
        kind = {torch.SymInt: "symint", torch.SymFloat: "symfloat", torch.SymBool: "symbool"}
        for symbol in sorted(node.expr.free_symbols, key=lambda s: s.name):
            self._record(symbol, node.shape_env)
        return {"$": kind[type(value)], "expr": encode_expr(node.expr)}

    def encode_dim(self, dim: int | torch.SymInt) -> Any:
        return self.encode_sym(dim) if isinstance(dim, torch.SymInt) else int(dim)

    def _record(self, symbol: sympy.Symbol, shape_env: ShapeEnv | None) -> None:
        if symbol.name in self.entries:
            return
        hint = _symbol_hint(symbol, shape_env)
        value_range = shape_env.var_to_range.get(symbol) if shape_env is not None else None
        sources = shape_env.var_to_sources.get(symbol, []) if shape_env is not None else []
        self.entries[symbol.name] = {
            "hint": hint,
            "lower": encode_expr(value_range.lower) if value_range is not None else None,
            "upper": encode_expr(value_range.upper) if value_range is not None else None,
            "source": _source_name(sources[0]) if sources else None,
            "positive": bool(symbol.is_positive),
            "float": not bool(symbol.is_integer),
            "unbacked": hint is None,
        }


def describe_tensor(tensor: torch.Tensor, symbols: SymbolTable, storage_group: int | None) -> dict:
    """The metadata of a fake (or real) tensor, sizes as encoded expressions."""
    return {
        "$": "fake",
        "shape": [symbols.encode_dim(d) for d in tensor.shape],
        "stride": [symbols.encode_dim(s) for s in tensor.stride()],
        "offset": symbols.encode_dim(tensor.storage_offset()),
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "device": str(tensor.device),
        "requires_grad": bool(tensor.requires_grad),
        "storage": storage_group,
    }


def storage_key(tensor: torch.Tensor) -> int | None:
    """An identity for the storage behind a fake tensor, or None when it has none."""
    try:
        return int(tensor.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


class FakeValueBuilder:
    """Rebuilds saved fake values in a fresh ``FakeTensorMode`` with its own ``ShapeEnv``."""

    def __init__(self, symbol_table: Mapping[str, Mapping[str, Any]]) -> None:
        self.shape_env = ShapeEnv()
        self.fake_mode = FakeTensorMode(shape_env=self.shape_env)
        self.symbols: dict[str, sympy.Symbol] = {}
        self.hints: dict[sympy.Symbol, int | float] = {}
        self._storages: dict[int, torch.Tensor] = {}
        for name, entry in symbol_table.items():
            self._create_symbol(name, entry)

    def sym(self, data: Mapping[str, Any]) -> Any:
        """A SymInt / SymFloat / SymBool from its encoded expression (a plain number if constant)."""
        expr = decode_expr(data["expr"], self.symbols)
        if data["$"] == "symbool":
            return self.shape_env.create_symboolnode(expr)
        hint = self._hint(expr)
        if data["$"] == "symfloat":
            return self.shape_env.create_symfloatnode(
                expr, hint=None if hint is None else float(hint)
            )
        return self.shape_env.create_symintnode(expr, hint=None if hint is None else int(hint))

    def dim(self, data: Any) -> int | torch.SymInt:
        return data if isinstance(data, int) else self.sym(data)

    def tensor(self, desc: Mapping[str, Any]) -> torch.Tensor:
        """A FakeTensor with the described metadata, sharing storage as described."""
        shape = [self.dim(d) for d in desc["shape"]]
        stride = [self.dim(s) for s in desc["stride"]]
        offset = self.dim(desc["offset"])
        dtype = getattr(torch, desc["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown dtype {desc['dtype']!r} in the graph file")
        device = torch.device(desc["device"])
        group = desc.get("storage")
        base = self._storages.get(group) if group is not None else None
        with self.fake_mode, torch.no_grad():
            if base is not None and self._fits(base, dtype, device, shape, stride, offset):
                tensor = base.as_strided(shape, stride, offset)
            elif _hint_of(offset) == 0:
                tensor = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            else:
                storage = torch.empty(offset + _extent(shape, stride), dtype=dtype, device=device)
                tensor = storage.as_strided(shape, stride, offset)
        if desc["requires_grad"] and not tensor.requires_grad:
            tensor = tensor.detach().requires_grad_(True)
        if group is not None and base is None:
            self._storages[group] = tensor
        return tensor

    def _create_symbol(self, name: str, entry: Mapping[str, Any]) -> None:
        from torch._dynamo.source import ConstantSource

        if entry["unbacked"]:
            create = self.shape_env.create_unbacked_symfloat
            if not entry["float"]:
                create = self.shape_env.create_unbacked_symint
            symbol = create().node.expr
        else:
            symbol = self.shape_env.create_symbol(
                entry["hint"],
                ConstantSource(entry["source"] or name),
                dynamic_dim=DimDynamic.DYNAMIC,
                positive=True if entry["positive"] else None,
                do_not_specialize_zero_one=True,
            )
            self.hints[symbol] = sympy.sympify(entry["hint"])
        self._constrain(symbol, entry)
        if symbol.name != name:
            log.debug("symbol %s of the file is %s after load", name, symbol.name)
        self.symbols[name] = symbol

    def _constrain(self, symbol: sympy.Symbol, entry: Mapping[str, Any]) -> None:
        if entry["lower"] is None or entry["float"] or not isinstance(symbol, sympy.Symbol):
            return
        lower = decode_expr(entry["lower"], {})
        upper = decode_expr(entry["upper"], {})
        try:
            self.shape_env.constrain_symbol_range(symbol, lower, upper)
        except Exception as error:  # best effort: the range only narrows what guards know
            log.debug("could not restore the range [%s, %s] of %s: %s", lower, upper, symbol, error)

    def _hint(self, expr: sympy.Basic) -> int | float | None:
        value = expr.xreplace(self.hints)
        if value.free_symbols or not value.is_number:
            return None
        return int(value) if value.is_integer else float(value)

    def _fits(self, base, dtype, device, shape, stride, offset) -> bool:
        """Whether a view of ``base``'s storage can hold this tensor (judged on hints)."""
        if base.dtype != dtype or base.device != device:
            return False
        needed = _hint_of(offset) + _extent(
            [_hint_of(d) for d in shape], [_hint_of(s) for s in stride]
        )
        available = _hint_of(base.untyped_storage().nbytes()) // base.element_size()
        return needed <= available


def _extent(shape, stride) -> Any:
    """Elements a strided tensor spans from its offset: 1 + sum((size - 1) * stride)."""
    if any(isinstance(d, int) and d == 0 for d in shape):
        return 0
    return 1 + sum((d - 1) * s for d, s in zip(shape, stride))


def _hint_of(value: Any) -> int:
    if isinstance(value, torch.SymInt):
        hint = value.node.hint
        return int(hint) if hint is not None else 0
    return int(value)


def _symbol_hint(symbol: sympy.Symbol, shape_env: ShapeEnv | None) -> int | float | None:
    if shape_env is None:
        return None
    # torch >= 2.12 keeps backed hints in backed_var_to_val; older versions in var_to_val.
    hints = getattr(shape_env, "backed_var_to_val", None)
    if hints is None:
        hints = getattr(shape_env, "var_to_val", {})
    value = hints.get(symbol)
    if value is None or not getattr(value, "is_number", False):
        return None
    return int(value) if value.is_integer else float(value)


def _source_name(source: Any) -> str:
    name = source.name
    return name() if callable(name) else str(name)
