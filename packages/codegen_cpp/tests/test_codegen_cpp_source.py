"""The generated source: readable structure, the ops handler's completeness, index printing."""

from __future__ import annotations

import pathlib
import re

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import codegen_cpp, loopir
from kiln.codegen_cpp._internal.kernel_source import CppHandler, c_literal
from kiln.codegen_cpp._internal.printer import cpp_expr
from kiln.loopir.codegen import evaluate_size


def _source(fn, *args, tracing_mode="real"):
    kg = loopir.lower(make_fx(fn, tracing_mode=tracing_mode)(*args))
    return kg, codegen_cpp.generate(kg)


def test_one_extern_c_function_per_kernel_with_commented_buffers():
    def f(x, w):
        h = torch.mm(x, w).relu()
        return h.sum(1), (h * 2).exp(), x.amax()

    kg, source = _source(f, torch.randn(4, 5), torch.randn(5, 3))
    functions = re.findall(r'extern "C" void (\w+)\(', source)
    assert functions == [k.name for k in kg.kernels]
    for kernel in kg.kernels:
        inputs = ", ".join(i.name for i in kernel.inputs)
        assert f"// {kernel.name}: reads {inputs}; writes" in source
        for spec in kernel.inputs:
            assert f"in_{spec.name}" in source
        for node in kernel.nodes:
            assert re.search(rf"// {node.name}: \w+\[", source), f"no comment names {node.name}"


def test_buffers_kept_in_registers_are_marked_and_never_stored():
    kg, source = _source(lambda x: (x.exp() * 2).sum(1), torch.randn(3, 4))
    local = [n.name for k in kg.kernels for n in k.temporaries]
    for name in local:
        assert f"// {name}:" in source and "(local only)" in source
        assert f"out_{name}" not in source


def test_symbols_are_int64_parameters():
    kg, source = _source(lambda x: x.sum(0) + 1, torch.randn(3, 4), tracing_mode="symbolic")
    (kernel, *_) = kg.kernels
    for sym in kernel.symbols:
        assert f"int64_t {sym.name}" in source


def test_handler_implements_every_op_of_the_protocol():
    missing = [name for name in loopir.OPS if not callable(getattr(CppHandler, name, None))]
    assert not missing, f"CppHandler lacks {missing}"


def test_handler_refuses_unknown_ops():
    kg = loopir.lower(make_fx(lambda x: x + 1)(torch.randn(2)))
    handler = CppHandler(kg.kernels[0])
    with pytest.raises(AttributeError, match="not part of the loopir ops protocol"):
        handler.no_such_op("tmp0")


_S0, _S1 = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
_I0 = loopir.index_vars(1)[0]


@pytest.mark.parametrize(("expr", "cpp", "value"), [
    (_S0 * 4 + _I0, "(i0 + (4 * s0))", 39),
    (loopir.FloorDiv(_I0, 3), "(i0 / 3)", 3),
    (sympy.Mod(_I0, _S1), "(i0 % s1)", 1),
    (sympy.Max(_S0 - 2, 0), "std::max<int64_t>(0, (-2 + s0))", 5),
    (_S0 ** 2, "(s0 * s0)", 49),
    (sympy.Integer(2**40), "1099511627776L", 2**40),
])
def test_index_printers(expr, cpp, value):
    """C++ text as expected; the host evaluates the same expression (run-time sizes) right."""
    assert cpp_expr(expr) == cpp
    assert evaluate_size(expr, {_S0: 7, _S1: 5, _I0: 11}) == value


def test_literals():
    assert c_literal(float("inf"), torch.float32) == "std::numeric_limits<float>::infinity()"
    assert c_literal(float("-inf"), torch.float64) == "-std::numeric_limits<double>::infinity()"
    assert c_literal(float("nan"), torch.float32) == "std::numeric_limits<float>::quiet_NaN()"
    assert c_literal(True, torch.bool) == "true"
    assert c_literal(2, torch.float32) == "static_cast<float>(2.0)"
    assert c_literal(-(2**63), torch.int64) == "static_cast<int64_t>(-9223372036854775807L - 1)"


def test_int64_extremes_and_overflow_wrap_as_in_eager(cpp):
    lo, hi = -(2**63), 2**63 - 1
    cpp.check(lambda x: (torch.maximum(x, torch.full((), lo)), torch.minimum(x, torch.full((), hi)),
                         torch.where(x > 0, hi, lo), x * 4, x + hi, -x, x.sum()),
              torch.tensor([-5, 0, 5, 2**62, lo, hi]))
    cpp.check(lambda x: (x * 3, x + x), torch.tensor([2**30, -(2**31), 7], dtype=torch.int32))


def test_readme_example_runs(tmp_path):
    readme = pathlib.Path(__file__).parents[1] / "README.md"
    code = re.search(r"```python\n(.*?)```", readme.read_text(), re.S).group(1)
    code = code.replace('"/tmp/kiln-cpp"', repr(str(tmp_path)))
    assert str(tmp_path) in code, "the README example should pass a cache_dir"
    exec(compile(code, str(readme), "exec"), {})  # noqa: S102
    assert list(tmp_path.glob("*/kernels.cpp"))


def test_verify_names_a_kernel_left_uncompiled(cpp):
    compiled = cpp.build(lambda x: x.exp().sum(1), torch.randn(3, 4))
    codegen_cpp.verify(compiled.module)
    with pytest.raises(ValueError, match="meta"):
        codegen_cpp.verify(compiled.kernel_graph.gm)
    kernel = compiled.kernel_graph.kernels[0]
    for node in compiled.module.graph.nodes:
        if getattr(node.target, "__name__", None) == kernel.name:
            node.target = kernel  # back to loopir's reference evaluator
    with pytest.raises(ValueError, match=rf"node {kernel.name} still calls loopir kernel"):
        codegen_cpp.verify(compiled.module)


def _gate(x):
    return x * torch.sigmoid(x) + torch.tanh(x) - torch.erf(x)


@pytest.mark.parametrize("vector_math", [True, False])
def test_libmvec_declarations_and_simd_pragmas_of_scalar_loops(tmp_path, vector_math):
    x = torch.randn(33, 65)
    kg = loopir.lower(make_fx(_gate)(x))
    options = codegen_cpp.CppOptions(cache_dir=tmp_path, vector_math=vector_math, parallel_threshold=0,
                                     vectorize=False)
    source = codegen_cpp.generate(kg, options)
    assert ("#pragma omp declare simd notinbranch\nfloat expf(float);" in source) == vector_math
    assert "// scalar loop: vectorization is off (CppOptions.vectorize)\n" in source
    assert "#pragma omp simd\n" in source  # the innermost pointwise loop
    module = codegen_cpp.compile(kg, options)
    torch.testing.assert_close(module(x), _gate(x))


def test_one_dimensional_pointwise_loop_is_parallel_simd_or_vector_code(tmp_path):
    kg = loopir.lower(make_fx(_gate)(torch.randn(100)))
    source = codegen_cpp.generate(kg, codegen_cpp.CppOptions(cache_dir=tmp_path, parallel_threshold=0, vectorize=False))
    assert "#pragma omp parallel for simd\n" in source  # scalar, marked simd
    source = codegen_cpp.generate(kg, codegen_cpp.CppOptions(cache_dir=tmp_path, parallel_threshold=0, vectorize=True))
    assert re.search(r"#pragma omp parallel for\n *for \(int64_t i0 = 0; i0 < kiln::vector_end\(100\); "
                     r"i0 \+= KILN_LANES\)", source)


def test_parallel_if_clause_only_where_sizes_are_unknown(tmp_path):
    """Known sizes decide at generation time: below the threshold the loop is no parallel
    construct (GCC 12 leaves the loop of a `parallel for simd if(0)` scalar), above it has no
    `if`; symbolic sizes keep the run-time clause."""
    options = codegen_cpp.CppOptions(cache_dir=tmp_path, parallel_threshold=1000, vectorize=False)
    small = codegen_cpp.generate(loopir.lower(make_fx(_gate)(torch.randn(10, 99))), options)
    assert "omp parallel" not in small and "#pragma omp simd\n" in small
    large = codegen_cpp.generate(loopir.lower(make_fx(_gate)(torch.randn(10, 100))), options)
    assert "#pragma omp parallel for\n" in large and " if(" not in large
    symbolic = codegen_cpp.generate(loopir.lower(make_fx(_gate, tracing_mode="symbolic")(torch.randn(10, 100))),
                                    options)
    assert re.search(r"#pragma omp parallel for if\(\(s\d+ \* s\d+\) >= 1000\)", symbolic), symbolic
