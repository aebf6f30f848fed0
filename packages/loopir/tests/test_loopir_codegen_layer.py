"""The shared codegen layer (`kiln.loopir.codegen`): host sizes without eval, the check/status
protocol, the artifact cache, and a text handler + kernel walker a toy codegen is built from."""

from __future__ import annotations

import os

import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import FloorDiv, index_vars, lower
from kiln.loopir.codegen import (
    ArtifactCache,
    CheckSite,
    KernelWalker,
    SizeFunction,
    TextHandler,
    compile_size,
    evaluate_size,
    layout_guard,
    node_summary,
    raise_failed_check,
)

S0, S1 = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)


@pytest.mark.parametrize(("expr", "value"), [
    (4 * S0 + S1, 33), (FloorDiv(S0 * S1, 3), 11), (sympy.Mod(S0 + 4, S1), 1), (sympy.Max(S0 - 9, 0), 0),
    (sympy.Min(S0, S1, 6), 5), (S0 ** 3, 343), (sympy.Integer(2**40), 2**40),
])
def test_sizes_are_evaluated_without_eval(expr, value):
    assert evaluate_size(expr, {S0: 7, S1: 5}) == value
    assert compile_size(expr, (S1, S0))([5, 7]) == value  # the order of the values is the params'


def test_size_function_rows_and_unknown_symbols():
    other = sympy.Symbol("s9", integer=True)
    rows = SizeFunction((S0, S1), [(S0, 2 * S1), (), (S0 * S1, other)], unknown_as_none=True)
    assert rows(3, 4) == [(3, 8), (), (12, None)]
    # every value known without the symbols (constants, or unknown ones as None)
    assert SizeFunction((S0, S1), [(other, 3)], unknown_as_none=True)(5, 6) == [(None, 3)]
    with pytest.raises(NotImplementedError, match="uses s9, which is not given at run time"):
        SizeFunction((S0,), [(other,)])
    with pytest.raises(NotImplementedError, match="cannot evaluate size expression"):
        compile_size(sympy.sin(S0), (S0,))
    with pytest.raises(NotImplementedError, match="cannot evaluate size expression"):
        compile_size(S0 / 2, (S0,))


def test_failed_check_raises_the_sites_error_with_its_size():
    sites = (CheckSite(RuntimeError, "buffer buf0: division by zero"),
             CheckSite(IndexError, "buffer buf1: index out of bounds for size {size}", 2 * S0))
    with pytest.raises(IndexError, match="kernel3: buffer buf1: index out of bounds for size 14"):
        raise_failed_check("kernel3", (S0,), sites, 2, (7,))
    with pytest.raises(RuntimeError, match="kernel3: buffer buf0: division by zero"):
        raise_failed_check("kernel3", (S0,), sites, 1, (7,))
    with pytest.raises(RuntimeError, match="reported run-time check 9, but it has 2 checks"):
        raise_failed_check("kernel3", (S0,), sites, 9, (7,))


def test_artifact_cache_writes_atomically_and_verifies_loads(tmp_path):
    cache = ArtifactCache(tmp_path / "cache", "kiln_toy_")
    key = cache.key("source", b"flags")
    assert key == cache.key("source", b"flags") != cache.key("sourceflags")  # parts are separated
    path = cache.path(key, ".txt")
    assert path.name == f"kiln_toy_{key}.txt" and not cache.verified(path)
    cache.write(path, "hello")
    assert cache.verified(path) and path.read_text() == "hello"
    assert oct((tmp_path / "cache").stat().st_mode & 0o777) == "0o700"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".sha256"]  # no temporaries
    path.write_text("hell")  # truncated or replaced: refused
    assert not cache.verified(path)
    built = cache.temporary(path)
    built.write_bytes(b"rebuilt")
    cache.adopt(built, path)
    assert cache.verified(path) and not built.exists()


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to make another user's dir")
def test_artifact_cache_refuses_another_users_directory(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 12345, 12345)
    with pytest.raises(Exception, match="belongs to user 12345"):
        ArtifactCache(foreign).write(foreign / "x", "y")


class ToyHandler(TextHandler):
    """A tiny text codegen on the shared layer: Python-ish statements, for tests."""

    def literal(self, value, dtype):
        return repr(value)

    def load(self, name, index):
        return self.local(name) or self.var(f"{self.pointer(name)}[{index}]")

    def store(self, name, index, value):
        if self.keep(name, value):
            self.lines.append(f"{self.pointer(name)}[{index}] = {value}")

    def reduction(self, name, reduction_type, dtype, value):
        body = self.end_loop_body()
        body.append(f"acc_{name} = {reduction_type}(acc_{name}, {value})")
        self.loop_body = body
        return self.var(f"acc_{name}")

    def store_reduction(self, name, index, value):
        self.store(name, index, value)


ToyHandler.install_templates({"exp": "exp({0})", "sub": "{0} - {1}", "truediv": "{0} / {1}"})


def _softmax_kernel():
    def softmax(x):
        e = (x - x.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)

    (kernel,) = lower(make_fx(softmax)(torch.randn(4, 8))).kernels
    return kernel


def test_walker_gives_each_kind_its_statements_and_scopes():
    kernel = _softmax_kernel()
    handler = ToyHandler(kernel)
    walker = KernelWalker(kernel, handler)
    kinds = [kind for _, kind in walker.nodes()]
    assert kinds == ["reduction", "row", "reduction", "row"]
    emitted = []
    for node, kind in walker.nodes():
        if kind == "reduction":
            with walker.reduction(node) as parts:
                walker.run(node)
            assert parts.body[0].startswith("tmp") and parts.body[-1].startswith("acc_")
            emitted.append(parts)
            # values of the loop are out of scope after it: the loop's load is not reused
            assert not any(text.startswith("in_x_1[") for text in handler.cache)
        else:
            with walker.row_loop(node) as body:
                walker.run(node)
            assert body and node.name not in handler.locals  # read back from memory afterwards
    assert handler.node is None and handler.lines == []


def test_text_handler_cse_constants_and_checks():
    kernel = _softmax_kernel()
    handler = ToyHandler(kernel)
    a, b = handler.load("x_1", index_vars(1)[0]), handler.load("x_1", index_vars(1)[0])
    assert a == b == "tmp0" and handler.lines == ["tmp0 = in_x_1[i0]"]
    two = handler.constant(2.0, torch.float32)
    assert handler.constant_value(two) == 2.0 and handler.constant_value(a) is None
    with handler.scope():
        inner = handler.exp(a)
    assert handler.exp(a) != inner  # defined again: the first is out of scope
    handler.node = kernel.nodes[0]
    number = handler.add_check(IndexError, "out of bounds for {size}", 3 * S0)
    assert number == 1 and handler.checks[0].message.startswith(f"buffer {kernel.nodes[0].name} (from ")
    assert node_summary(kernel.nodes[0]).startswith(f"{kernel.nodes[0].name}: float32[4, 1], max over [8] <- ")


def test_layout_guard_passes_only_tensors_of_the_same_layouts():
    """`layout_guard`: True only for as many tensors of the same dtype, device, sizes and strides
    (and Python type); its False leaves the decision to the caller's own check."""
    x, w = torch.randn(4, 6), torch.nn.Parameter(torch.randn(6))
    guard = layout_guard((x, w))
    if guard is None:
        pytest.skip("this torch has no TensorGuards: callers keep their Python check alone")
    assert guard(torch.randn(4, 6), torch.nn.Parameter(torch.randn(6)))
    x_misaligned = torch.randn(25)[1:].view(4, 6)  # alignment is not the guard's business
    assert guard(x_misaligned, w)
    for other in [(torch.randn(6, 4).t(), w), (torch.randn(4, 6, dtype=torch.float64), w), (torch.randn(4, 7), w),
                  (x, torch.randn(6)), (x, w.detach()), (x,), (x, w, w), (x, 3.0), ([1.0] * 6, w)]:
        try:
            assert not guard(*other)
        except TypeError:  # another number of arguments than tensors it was built from
            assert len(other) != 2
    assert layout_guard(()) is None
    assert layout_guard((x.to_sparse(),)) is None


def test_shared_reduction_loops_join_independent_reductions_of_the_same_rows():
    """sum and amax of x share a loop; softmax's sum of exp(x - max) reads the max and keeps its
    own; a codegen's `key` keeps apart what it cannot join."""
    from kiln.loopir.codegen import shared_reduction_loops

    def fn(x):
        m = x.amax(-1)
        return x.sum(-1), m, (x - m[:, None]).exp().sum(-1)

    kg = lower(make_fx(fn)(torch.randn(4, 32)))
    (kernel,) = kg.kernels
    reads_max = [n.name for n in kernel.nodes if "exp" in str(n)]
    assert len([n for n in kernel.nodes if n.reduction_ranges]) == 3 and len(reads_max) == 1
    groups = [[n.name for n in nodes] for nodes in shared_reduction_loops(kernel).values()]
    assert sorted(map(len, groups)) == [1, 2] and [g for g in groups if len(g) == 1][0] == reads_max
    # keyed by reduction type: the max alone; the exp sum, whose max was made before the plain
    # sum's loop began, joins that loop
    apart = shared_reduction_loops(kernel, key=lambda node: (node.body.reduction_type,))
    assert sorted(sorted(n.body.reduction_type for n in nodes) for nodes in apart.values()) == [["max"], ["sum", "sum"]]
