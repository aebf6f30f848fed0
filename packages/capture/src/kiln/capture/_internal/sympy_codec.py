"""Symbolic sizes as JSON data, and back, without ``eval``.

A sympy expression becomes a tree: a symbol ``{"sym": "s0"}``, a number, or a function
application ``{"fn": "FloorDiv", "args": [...]}``. Decoding builds only the functions of an
allowlist (sympy's arithmetic and relations, and torch's own sympy functions such as
``FloorDiv`` and ``ModularIndexing``), so a saved file cannot make ``load`` run code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import sympy

log = logging.getLogger(__name__)

_SYMPY_FUNCTIONS: dict[str, Callable[..., sympy.Basic]] = {
    "Add": sympy.Add,
    "Mul": sympy.Mul,
    "Pow": sympy.Pow,
    "Abs": sympy.Abs,
    "floor": sympy.floor,
    "ceiling": sympy.ceiling,
    "Equality": sympy.Eq,
    "Unequality": sympy.Ne,
    "StrictLessThan": sympy.Lt,
    "LessThan": sympy.Le,
    "StrictGreaterThan": sympy.Gt,
    "GreaterThan": sympy.Ge,
    "And": sympy.And,
    "Or": sympy.Or,
    "Not": sympy.Not,
}
_OPAQUE_UNARY = "OpaqueUnaryFn_"


class ExprCodecError(ValueError):
    """An expression that cannot be encoded, or an encoded tree naming an unknown function."""


def encode_expr(expr: sympy.Basic) -> Any:
    """Encode a sympy expression as JSON data (ints, floats, bools, lists and dicts)."""
    if isinstance(expr, sympy.Symbol):
        return {"sym": expr.name}
    if expr is sympy.true or expr is sympy.false:
        return bool(expr)
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Rational):
        return {"rat": [int(expr.p), int(expr.q)]}
    if isinstance(expr, sympy.Float):
        return float(expr)
    constant = _constant_name(expr)
    if constant is not None:
        return {"const": constant}
    name = type(expr).__name__
    if _function(name) is None:
        raise ExprCodecError(f"cannot save the symbolic expression {expr}: unknown function {name}")
    return {"fn": name, "args": [encode_expr(arg) for arg in expr.args]}


def decode_expr(data: Any, symbols: Mapping[str, sympy.Symbol]) -> sympy.Basic:
    """Rebuild an expression encoded by ``encode_expr``; symbols are looked up by name."""
    if isinstance(data, bool):
        return sympy.true if data else sympy.false
    if isinstance(data, int):
        return sympy.Integer(data)
    if isinstance(data, float):
        return sympy.Float(data)
    if not isinstance(data, dict):
        raise ExprCodecError(f"not an encoded expression: {data!r}")
    if "sym" in data:
        try:
            return symbols[data["sym"]]
        except KeyError:
            raise ExprCodecError(
                f"symbol {data['sym']!r} is not in the file's symbol table"
            ) from None
    if "rat" in data:
        return sympy.Rational(*data["rat"])
    if "const" in data:
        return _constant(data["const"])
    function = _function(data.get("fn", ""))
    if function is None:
        raise ExprCodecError(f"unknown function {data.get('fn')!r} in a symbolic expression")
    return function(*(decode_expr(arg, symbols) for arg in data["args"]))


def _constant_name(expr: sympy.Basic) -> str | None:
    if expr is sympy.oo:
        return "oo"
    if expr is sympy.S.NegativeInfinity:
        return "-oo"
    name = type(expr).__name__
    if name == "IntInfinity":
        return "int_oo"
    if name == "NegativeIntInfinity":
        return "-int_oo"
    return None


def _constant(name: str) -> sympy.Basic:
    if name in ("oo", "-oo"):
        return sympy.oo if name == "oo" else -sympy.oo
    if name in ("int_oo", "-int_oo"):
        from torch.utils._sympy.numbers import int_oo

        return int_oo if name == "int_oo" else -int_oo
    raise ExprCodecError(f"unknown constant {name!r} in a symbolic expression")


def _function(name: str) -> Callable[..., sympy.Basic] | None:
    """The allowlisted callable building ``name``; torch's functions win over sympy's."""
    from torch.utils._sympy import functions as torch_functions

    candidate = getattr(torch_functions, name, None)
    if isinstance(candidate, type) and issubclass(candidate, sympy.Basic):
        return candidate
    if name.startswith(_OPAQUE_UNARY):
        return _opaque_unary_function(name.removeprefix(_OPAQUE_UNARY))
    return _SYMPY_FUNCTIONS.get(name)


def _opaque_unary_function(math_name: str) -> Callable[..., sympy.Basic] | None:
    """torch builds ``OpaqueUnaryFn_<name>`` classes on demand; build the same one."""
    from torch.utils._sympy import functions as torch_functions

    try:
        return torch_functions.make_opaque_unary_fn(math_name)
    except (AttributeError, TypeError, ValueError):
        log.debug("no opaque sympy function for %s in this torch version", math_name)
        return None
