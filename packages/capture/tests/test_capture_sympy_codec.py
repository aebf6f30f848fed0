import pytest
import sympy
from torch.utils._sympy.functions import FloorDiv, Max, ModularIndexing, PythonMod
from torch.utils._sympy.numbers import int_oo

from kiln.capture._internal.sympy_codec import ExprCodecError, decode_expr, encode_expr

s0 = sympy.Symbol("s0", integer=True, positive=True)
s1 = sympy.Symbol("s1", integer=True, positive=True)
SYMBOLS = {"s0": s0, "s1": s1}


@pytest.mark.parametrize(
    "expr",
    [
        s0 * s1 - 1,
        FloorDiv(s0, 2) + ModularIndexing(s1, 1, 4),
        Max(s0, s1 + 3),
        PythonMod(s0, s1),
        sympy.Rational(1, 3) * s0,
        sympy.Lt(s0, 2 * s1),
        sympy.And(sympy.Ge(s0, 2), sympy.Le(s1, 64)),
        int_oo,
        -int_oo,
        sympy.Integer(7),
    ],
)
def test_round_trip(expr):
    data = encode_expr(expr)
    assert decode_expr(data, SYMBOLS) == expr


def test_unknown_functions_and_symbols_are_refused():
    with pytest.raises(ExprCodecError, match="unknown function 'eval'"):
        decode_expr({"fn": "eval", "args": ["1"]}, SYMBOLS)
    with pytest.raises(ExprCodecError, match="symbol 's9' is not in the file's symbol table"):
        decode_expr({"sym": "s9"}, SYMBOLS)
    with pytest.raises(ExprCodecError, match="unknown function"):
        encode_expr(sympy.sin(s0))
