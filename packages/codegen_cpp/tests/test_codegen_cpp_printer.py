"""Index expressions printed as C++ keep sympy's floor semantics for `//` and `%`, also where
sympy has made a dividend negative (Mod(39 - m, 2) becomes Mod(1 - m, 2)): compiled and run."""

import shutil
import subprocess

import pytest
import sympy

from kiln.codegen_cpp._internal.printer import cpp_expr
from kiln.loopir import FloorDiv

m = sympy.Symbol("m", integer=True, nonnegative=True)
EXPRESSIONS = [sympy.Mod(39 - m, 2), sympy.Mod(1 - m, 3), FloorDiv(1 - m, 3), FloorDiv(5 - 2 * m, 4),
               sympy.Mod(m + 7, 5), FloorDiv(m + 7, 5)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (the C++ codegen's compiler)")
def test_floor_division_and_remainder_of_negative_dividends(tmp_path):
    lines = [f'std::printf("%lld\\n", (long long){cpp_expr(e)});' for e in EXPRESSIONS]
    source = tmp_path / "probe.cpp"
    source.write_text("#include <cstdio>\n#include <cstdint>\n#include <algorithm>\nint main(int argc, char**) {\n"
                      "  for (int64_t m = 0; m < 9; ++m) {\n    " + "\n    ".join(lines) + "\n  }\n}\n")
    subprocess.run(["g++", "-O1", "-o", str(tmp_path / "probe"), str(source)], check=True)
    got = [int(v) for v in subprocess.run([str(tmp_path / "probe")], check=True, capture_output=True,
                                          text=True).stdout.split()]
    floor = {FloorDiv: lambda a, b: a // b, sympy.Mod: lambda a, b: a % b}
    want = [floor[type(e)](int(e.args[0].subs(m, value)), int(e.args[1])) for value in range(9) for e in EXPRESSIONS]
    assert got == want
