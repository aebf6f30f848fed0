"""Fuzzer programs (tools/fuzz.py, dynamic shapes) whose kiln regions got sizes computed outside
them: `Max(0, s17 + s77 - 1)` (the divisor of `cat(...).var(0)`), `(s58 + 1)//2` (a `[..., ::2]`
slice's length). A SymInt region input that is such an expression is a symbol of its own in
loopir, bound to the input, so kernels no longer need symbols no input of the region gives."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend


def _cat_var(x, y):
    return torch.cat([x, y]).var(0)


def _cat_var_norm(x0, x1):  # fuzz seed 2000149
    v1 = torch.cat([x0, x0 * 2], -1)
    return ((v1.var(0) * v1.var(0)) - x1).norm(dim=-1)


def _strided_std(x0):  # fuzz seed 4000366
    x0 = x0.clamp(-1, 1)
    return x0[..., ::2].std(-1), torch.abs(x0)


def _strided_group_norm(x0):  # fuzz seed 4000879
    return torch.nn.functional.group_norm(x0[..., ::2], 1)


def _diagonal_sum(x):  # fuzz seed 2000285
    return x.diagonal().sum()


CASES = {
    "cat_var": (_cat_var, [((4, 6), (3, 6)), ((2, 5), (6, 5))]),
    "cat_var_norm": (_cat_var_norm, [((3,), (3,)), ((5,), (1,))]),
    "strided_std": (_strided_std, [((1, 5),), ((3, 8),)]),
}


def _compile(fn, codegen):
    def kiln(gm, example_inputs):
        return backend(gm, example_inputs, options={"fallback": False, "codegen": codegen})

    return torch.compile(fn, backend=kiln, dynamic=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_region_inputs_computed_outside_the_region(name):
    fn, shapes = CASES[name]
    compiled = _compile(fn, "cpu")
    for sizes in shapes:
        args = [torch.randn(s) for s in sizes]
        torch.testing.assert_close(compiled(*args), fn(*args))


@pytest.mark.parametrize("codegen", ["cpu", "cuda"])
def test_group_norm_of_a_strided_slice(codegen):
    """The region's input has size (s58 + 1)//2 and no input gives s58 alone: the kernel graph
    passes 2*m - 1 for it, m the input's size, which keeps (s58 + 1)//2."""
    compiled = _compile(_strided_group_norm, codegen)
    for shape in ((3, 4, 5), (2, 3, 8), (4, 2, 7)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), _strided_group_norm(x))


def _strided_float64(x0, x2):  # fuzz seed 3000160 (its size (s33 - 1)*Abs(FloorDiv(s33 + 1, 2)) + ...)
    v0 = torch.minimum(x0, x2)
    return v0, v0[..., ::2]


def _index_after_reduction(x):  # fuzz seed 2000833, reduced
    return (x - x.sum())[torch.tensor([2])]


@pytest.mark.parametrize("codegen", ["cpu", "cuda"])
def test_diagonal_sum(codegen):
    """The diagonal's input size s6 is used by no index of the kernel (the diagonal of a [s6, 1]
    tensor has one element), but the Triton runtime evaluates its inputs' sizes: the kernel takes
    every symbol of its buffers' sizes and strides that the kernel graph can give."""
    compiled = _compile(_diagonal_sum, codegen)
    for shape in ((3, 1), (4, 6), (5, 2)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), _diagonal_sum(x))


@pytest.mark.parametrize("codegen", ["cpu", "cuda"])
def test_strided_slice_of_float64(codegen):
    compiled = _compile(_strided_float64, codegen)
    for n in (5, 8):
        args = [torch.randn(n, n, dtype=torch.float64) for _ in range(2)]
        torch.testing.assert_close(compiled(*args), _strided_float64(*args))


def test_index_after_a_reduction_on_the_triton_interpreter():
    """codegen_triton once loaded at a scalar index (an indirect index read from a 1-element
    tensor) under a block mask: 'Mask argument cannot be block type if pointer argument is not a block'."""
    compiled = _compile(_index_after_reduction, "cuda")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), _index_after_reduction(x))
