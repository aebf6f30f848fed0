"""Index arithmetic of generated kernels (`_internal/indexing.py`): offsets in flat positions
(no `//` or `%` where an access walks its loop contiguously), 32-bit index arithmetic when every
index value fits, 64-bit when one may not, and the width chosen at launch for symbolic sizes."""

import itertools
import json
import os
import random
import subprocess
import sys

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.codegen_triton import TritonOptions, compile, generate
from kiln.codegen_triton._internal import runtime
from kiln.codegen_triton._internal.indexing import (
    INT32_LIMIT,
    XINDEX,
    FlatLoop,
    flat_offset,
    index_bounds,
    index_width,
    inner_loop,
    outer_loop,
)
from kiln.codegen_triton._internal.printer import triton_expr
from kiln.loopir import FloorDiv, index_vars, lower
from kiln.loopir.codegen import compile_size

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes

I0, I1, I2, I3 = index_vars(4)
R0, R1 = index_vars(2, "r")
S0, S1 = sympy.symbols("s0 s1", integer=True, positive=True)


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    return TritonOptions(cache_dir=tmp_path_factory.mktemp("triton_cache"), xblock=64)


def accesses(source):
    """{pointer: [offset, ...]} of every tl.load / tl.store in `source`."""
    found = {}
    for chunk in source.split("tl.load(")[1:] + source.split("tl.store(")[1:]:
        depths = itertools.accumulate({"(": 1, ")": -1}.get(char, 0) for char in chunk)
        end = next(pos for pos, (char, depth) in enumerate(zip(chunk, depths)) if char == "," and depth == 0)
        pointer, _, offset = chunk[:end].partition(" + ")
        found.setdefault(pointer, []).append(offset)
    return found


def run_and_compare(fn, args, options, tracing_mode="real", **lower_options):
    module = compile(lower(make_fx(fn, tracing_mode=tracing_mode)(*args), **lower_options), options)
    for got, expected in zip(module(*args), fn(*args)):
        torch.testing.assert_close(got, expected)
    return module


def test_contiguous_pointwise_kernel_indexes_with_xindex_in_32_bits(options):
    def gelu_bias(x, b):
        y = x + b
        return (y * 0.5 * (1 + torch.erf(y * 0.7071067811865476)),)

    args = (torch.randn(64, 96), torch.randn(96))
    module = run_and_compare(gelu_bias, args, options)
    source = module.meta["kiln_triton"].source
    assert "xoffset = tl.program_id(0) * XBLOCK" in source
    assert "tl.int64" not in source  # no widening anywhere: every value fits in 32 bits
    found = accesses(source)
    (out,) = [pointer for pointer in found if pointer.startswith("out_")]
    assert found == {"in_x_1": ["xindex"], "in_b_1": ["i1"], out: ["xindex"]}
    assert "i1 = xindex % 96" in source
    assert "i0 =" not in source  # only the variables the body uses are defined


def test_reductions_and_rows_index_without_divisions(options):
    def fn(x, y):
        e = torch.exp(y - y.amax(-1, keepdim=True))
        return x.sum((1, 2)), x.sum(-1), e / e.sum(-1, keepdim=True), x.flatten(1).argmax(-1)

    module = run_and_compare(fn, (torch.randn(4, 5, 6), torch.randn(8, 50)), options, row_temporaries=True)
    source = module.meta["kiln_triton"].source
    offsets = [o for found in accesses(source).values() for o in found]
    assert offsets and not [o for o in offsets if "//" in o or "%" in o]
    assert "(30*i0 + rindex)" in offsets or "(rindex + 30*i0)" in offsets  # sum over two dims: one flat walk
    assert "tl.program_id(0).to(" not in source and "rbase = tl.arange(0, RBLOCK)[None, :]\n" in source


def test_transposed_and_broadcast_accesses_keep_their_variables(options):
    def fn(x, row, col):
        return x.transpose(0, 1) * row + col  # eager's result is transposed, as x.transpose(0, 1)

    args = (torch.randn(7, 5), torch.randn(7), torch.randn(5, 1))
    module = run_and_compare(fn, args, options)
    found = accesses(module.meta["kiln_triton"].source)
    # loopir runs the loops in the output's memory order (i0 over x's rows, i1 along them), so
    # x is read, and the output stored, contiguously; the broadcast operands keep their variable
    assert found["in_x_1"] == ["xindex"]
    assert found["in_row_1"] == ["i0"] and found["in_col_1"] == ["i1"]
    # the output has eager's layout, x's transposed one: stored where x is read
    assert [found[p] for p in found if p.startswith("out_")] == [found["in_x_1"]]
    assert module(*args).stride() == fn(*args).stride() == (1, 5)


def huge_source(fn, *shapes):
    """The source for `fn` on meta tensors (too large to allocate): generation only."""
    args = [torch.empty(shape, device="meta") for shape in shapes]
    return generate(lower(make_fx(fn, tracing_mode="fake")(*args)))


def test_more_than_2_31_elements_keep_64_bit_indices():
    source = huge_source(lambda x: x * 2, (2**16, 2**16 + 1))
    assert "xoffset = tl.program_id(0).to(tl.int64) * XBLOCK" in source
    assert set(map(tuple, accesses(source).values())) == {("xindex",)}
    source = huge_source(lambda x: x.sum(0), (2**16 + 1, 2**15))
    assert "rbase = tl.arange(0, RBLOCK)[None, :].to(tl.int64)" in source


def test_few_elements_at_large_offsets_keep_64_bit_indices():
    # 32769 outputs, but the loads reach offset 65536 * 32768 = 2**31 of the input.
    assert ".to(tl.int64) * XBLOCK" in huge_source(lambda x: x[:, 0] * 2, (2**15 + 1, 2**16))
    assert ".to(tl.int64)" not in huge_source(lambda x: x[:, 0] * 2, (2**14, 2**16))


def test_index_width_decision():
    assert index_width([sympy.Integer(INT32_LIMIT - 1), sympy.Integer(5)], ()).bits == 32
    assert index_width([sympy.Integer(INT32_LIMIT)], ()).bits == 64
    launch = index_width([S0 * S1, sympy.Integer(7)], (S0, S1))
    assert launch.bits is None and launch.bounds == (S0 * S1,)
    assert index_width([S0 * S1, sympy.Integer(2**40)], (S0, S1)).bits == 64  # too large whatever the sizes
    assert index_width([S0 * R0], (S0,)).bits == 64  # not a function of the size arguments


def test_dynamic_shapes_choose_the_width_at_launch(options, monkeypatch):
    def fn(x, b):
        return torch.sigmoid(x + b), (x + b).transpose(0, 1) * 2, (x * b).sum(-1), x.sum(0)

    example = (torch.randn(5, 7), torch.randn(7))
    module = compile(lower(make_fx(fn, tracing_mode="symbolic")(*example), fuse_rows=False), options)
    source = module.meta["kiln_triton"].source
    assert source.count("INDEX_64: tl.constexpr") == len(module.meta["kiln_triton"].kernels)
    assert "tl.load(in_x_1 + xindex, xmask)" in source  # contiguous in symbolic sizes too
    kernels = [n.target for n in module.graph.nodes if type(n.target).__name__ == "TritonKernel"]
    for wide in (False, True):
        if wide:  # every launch takes 64 bits: the widened sizes and positions compute the same
            monkeypatch.setattr(runtime, "INT32_LIMIT", 0)
            for kernel in kernels:
                kernel._plans.clear()
        for shape in [(5, 7), (3, 33), (1, 4), (17, 1)]:
            args = (torch.randn(shape), torch.randn(shape[1]))
            for got, expected in zip(module(*args), fn(*args)):
                torch.testing.assert_close(got, expected)
        assert {plan.launch["INDEX_64"] for k in kernels for plan in k._plans.values()} == {wide}


def python_value(expr, env):
    """`expr` evaluated on the host (as launchers compute sizes) with symbols named in `env`."""
    symbols = sorted(sympy.sympify(expr).free_symbols, key=str)
    return compile_size(expr, symbols)([env[s.name] for s in symbols])


def random_linear(rng, variables, sizes):
    """A random access: strides of a (possibly permuted, broadcast, offset) view of a buffer."""
    order = list(range(len(variables)))
    if rng.random() < 0.3:
        rng.shuffle(order)
    strides, stride = {}, rng.choice([1, 1, 2])
    for dim in reversed(order):
        strides[dim] = 0 if rng.random() < 0.15 else stride
        stride *= sizes[dim]
    expr = sympy.Integer(rng.choice([0, 0, 3])) + sum(strides[d] * v for d, v in enumerate(variables))
    if rng.random() < 0.3:  # a view of a lazy value: division or remainder of a flat position
        expr = (FloorDiv if rng.random() < 0.5 else sympy.Mod)(expr, rng.choice([2, 3, 4, 6]))
    return expr


def test_flat_offset_equals_the_original_everywhere():
    rng = random.Random(0)
    for _ in range(150):
        sizes = tuple(sympy.Integer(rng.choice([1, 2, 3, 4, 5])) for _ in range(rng.randint(1, 4)))
        inner = tuple(sympy.Integer(rng.choice([1, 3, 4])) for _ in range(rng.randint(0, 2)))
        outer, loops = outer_loop(sizes), (outer_loop(sizes),)
        variables = list(outer.variables)
        if inner:
            loops += (inner_loop(inner),)
            variables += list(loops[1].variables)
        expr = random_linear(rng, variables, sizes + inner)
        rewritten = flat_offset(expr, loops)
        for x, r in itertools.product(range(int(outer.numel)), range(int(inner_loop(inner).numel))):
            env = {"xindex": x, "rindex": r}
            for loop in loops:
                env.update({v.name: python_value(e, env) for v, e in loop.unflattening().items()})
                env.update({v.name: 0 for v, size in zip(loop.variables, loop.sizes) if size == 1})
            assert python_value(rewritten, env) == python_value(expr, env), (expr, rewritten, sizes, inner)


@pytest.mark.parametrize(("expr", "sizes", "expected"), [
    (256 * I0 + I1, (8, 256), "xindex"),
    (1024 * I0 + 64 * I1 + I2, (2, 16, 64), "xindex"),
    (16 * I0 + I1, (2, 16, 64), "(xindex // 64)"),  # a [2, 16, 1] buffer broadcast over the last dim
    (64 * I1 + I2 + 3, (2, 16, 64), "(xindex % 1024) + 3"),
    (sympy.Mod(FloorDiv(1024 * I0 + 64 * I1 + I2, 4), 6), (2, 16, 64), "((xindex // 4) % 6)"),
    (I0 + 5 * I1, (5, 7), "i0 + 5*i1"),  # a transpose: nothing cheaper
    (S1 * I0 + I1, (S0, S1), "xindex"),
    (3 * S1 * I0 + 3 * I1 + 2, (S0, S1), "3*xindex + 2"),
    (7 * I1 + I2, (S0, S1, 7), "(xindex % (7*s1))"),
])
def test_flat_offset_examples(expr, sizes, expected):
    loop = outer_loop(tuple(map(sympy.sympify, sizes)))
    assert triton_expr(flat_offset(expr, (loop,))) == expected


def test_only_varying_dims_take_a_remainder():
    loop = FlatLoop(XINDEX, (I0, I1, I2), tuple(map(sympy.Integer, (1, 4, 5))))
    assert {v.name: triton_expr(e) for v, e in loop.unflattening().items()} == {"i1": "(xindex // 5)",
                                                                                   "i2": "(xindex % 5)"}


def subexpression_values(expr, env):
    """Every value evaluating `expr` computes, in sympy's argument order."""
    for sub in sympy.preorder_traversal(expr):
        if sub.is_Atom:
            continue
        yield python_value(sub, env)
        if sub.is_Add or sub.is_Mul:
            for n in range(2, len(sub.args)):
                yield python_value(sub.func(*sub.args[:n]), env)


def test_index_bounds_bound_every_intermediate_value():
    rng = random.Random(1)
    for _ in range(100):
        sizes = tuple(rng.choice([1, 2, 3, 7]) for _ in range(3))
        expr = random_linear(rng, (I0, I1, I2), tuple(map(sympy.Integer, sizes)))
        expr = expr * rng.choice([1, -2, 5]) + rng.choice([0, I0 * I1, -I2])
        bound = max(index_bounds(expr, {v: sympy.Integer(s - 1) for v, s in zip((I0, I1, I2), sizes)}))
        for point in itertools.product(*(range(s) for s in sizes)):
            env = dict(zip(("i0", "i1", "i2"), point))
            assert all(abs(v) <= bound for v in subexpression_values(expr, env)), (expr, bound)


def test_index_bounds_of_symbolic_sizes_evaluate_at_launch():
    bounds = index_bounds(S1 * I0 + I1, {I0: S0 - 1, I1: S1 - 1})
    values = [python_value(b, {"s0": 1000, "s1": 3000}) for b in bounds]
    assert max(values) == 1000 * 3000 - 1
    ind = sympy.Symbol("ind0", integer=True)  # an indirect index: 64-bit, counted as 0
    assert max(index_bounds(64 * ind + I0, {I0: sympy.Integer(9), ind: sympy.Integer(0)})) == 64  # the literal
    # 1000*i0 may be computed in the index width before the product with the 64-bit ind0
    assert max(index_bounds(1000 * I0 * ind, {I0: sympy.Integer(9), ind: sympy.Integer(0)})) == 9000
    assert max(index_bounds(1000 * FloorDiv(-I0, 2), {I0: sympy.Integer(9)})) >= 5000  # floor(-9 / 2) == -5


# Compiles the kernel in `sys.argv[1]` (a generated source file) with Triton's NVIDIA backend, no
# GPU needed, for each (INDEX_64, size argument of 1) and prints its 64-bit divisions and remainders.
COMPILE_FOR_SM90 = """
import importlib.util, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

spec = importlib.util.spec_from_file_location("generated", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
jit = module.kernel0
names = jit.arg_names
found = {}
for wide in (False, True):
    for size_one in (False, True):
        signature = {n: "*fp32" if n.startswith(("in_", "out_")) else "i32" for n in names}
        signature.update(XBLOCK="constexpr", INDEX_64="constexpr")
        constants = {(names.index("XBLOCK"),): 1024, (names.index("INDEX_64"),): wide}
        if size_one:  # Triton passes a size argument of 1 as a constexpr
            signature[names[-3]] = "constexpr"
            constants[(len(names) - 3,)] = 1
        ptx = triton.compile(ASTSource(jit, signature, constants), target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        found[f"{wide} {size_one}"] = sum(ptx.count(op) for op in ("div.s64", "rem.s64", "div.u64", "rem.u64"))
print(json.dumps(found))
"""


def test_symbolic_kernel_compiles_for_a_gpu_in_both_widths(options):
    """Triton's NVIDIA backend compiles what the interpreter cannot check: both ``INDEX_64``
    branches' types, a size of 1 passed as a constexpr, and 32-bit kernels dividing in 32 bits.
    In a separate process: under ``TRITON_INTERPRET=1`` Triton's own library is interpreted."""
    pytest.importorskip("triton.backends.nvidia.compiler")
    fn = lambda x, b: torch.sigmoid(x + b) * x  # noqa: E731
    module = compile(lower(make_fx(fn, tracing_mode="symbolic")(torch.randn(5, 7), torch.randn(7))), options)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90, str(module.meta["kiln_triton"].source_path)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    divisions = json.loads(result.stdout.splitlines()[-1])
    assert divisions["False False"] == divisions["False True"] == 0
    assert divisions["True False"] > 0  # `xindex % s` in 64 bits: the widening is real
