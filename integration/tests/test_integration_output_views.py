"""Outputs eager returns as views keep eager's strides, and views of inputs alias the input.

A view of a computed value whose strides no buffer of its own has (``expand``'s stride 0, a
diagonal, a slice with gaps under dynamic shapes) is returned as a view of that value, computed
in its eager layout (loopir `output_views.py`); a view of an input the graph mutated in place is a
view of that input (integration `output_aliases.py`). Training graphs keep their outputs out of
views of intermediates (an `autograd.Function` output that is a view cannot be modified in place).
Outputs whose decomposition ends in another layout than the op it replaced keep that op's
(integration `output_layouts.py`). Cases from the fuzzer's stride check (issue 19). Each case
compiles with ``fallback=False`` and checks that kiln kernels ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._prims_common import check_significant_strides

from kiln.integration import explain

OPTIONS = {"fallback": False, "codegen": "cpu"}


def compiled_outputs(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> tuple[torch.Tensor, ...]:
    """`fn(*args)` compiled by kiln: its outputs (a tuple), after checking kiln kernels ran."""
    captured: list[Any] = []

    def program(*inputs: Any) -> Any:
        captured.append(fn(*inputs))
        return captured[-1]

    torch._dynamo.reset()
    with torch._dynamo.config.patch(assume_static_by_default=not dynamic):
        report = explain(program, *args, options=OPTIONS)
    assert report.kernel_count > 0, report
    result = captured[-1]
    return result if isinstance(result, tuple) else (result,)


def assert_like_eager(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, check_stride=False)
        same, dim = check_significant_strides(g, w, only_cuda=False)
        assert same, f"output {i}: strides {g.stride()} where eager gives {w.stride()} (dim {dim})"


# (function, input shape, dynamic shapes): dynamic where a static-shape buffer of the output's own
# already has eager's strides (a slice's gaps) but symbolic strides do not.
VIEWS_OF_INTERMEDIATES = {
    "expand": (lambda x: (x.sum(0, keepdim=True) * 2).expand(4, 5), (4, 5), False),
    "unsqueeze_expand": (lambda x: torch.relu(x).unsqueeze(0).expand(2, *x.shape), (3, 5), False),
    "unsqueeze_expand_dynamic": (lambda x: torch.relu(x).unsqueeze(0).expand(2, *x.shape), (3, 5), True),
    "slice_dynamic": (lambda x: (x * 2)[:, 1:], (4, 5), True),
    "step_slice_dynamic": (lambda x: torch.clamp(x, -0.5, 0.5)[..., ::2], (8, 4), True),
    "diagonal_dynamic": (lambda x: torch.tril(x * 3).diagonal(), (3, 3), True),
    "diagonal_of_softmax_dynamic": (lambda x: torch.log_softmax(x, -2).diagonal(), (5, 5), True),
}


@pytest.mark.parametrize("name", sorted(VIEWS_OF_INTERMEDIATES))
def test_views_of_intermediates_have_eager_strides(name):
    fn, shape, dynamic = VIEWS_OF_INTERMEDIATES[name]
    x = torch.randn(shape)
    assert_like_eager(compiled_outputs(fn, x.clone(), dynamic=dynamic), (fn(x),))


def test_expanded_output_is_a_view_of_its_value():
    """The unexpanded value is computed once; the output views it with eager's stride 0."""
    (out,) = compiled_outputs(lambda x: torch.sin(x).unsqueeze(0).expand(3, 4, 5), torch.randn(4, 5))
    assert out.stride() == (0, 5, 1)
    assert out._base is not None and out._base.numel() == 20


def test_outputs_share_storage_where_eager_shares():
    def fn(x):
        y = torch.exp(x)
        return y, y.unsqueeze(0).expand(2, *y.shape)

    x = torch.randn(3, 4)
    got, want = compiled_outputs(fn, x.clone()), fn(x)
    assert_like_eager(got, want)
    assert got[1].untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()


def transposed(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _relu_then_transpose(x):
    x.relu_()
    return x.t(), x * 2


def _scale_then_expand(x):
    x.mul_(0.5)
    return (x.unsqueeze(0).expand(2, *x.shape),)


def _zero_row_then_diagonal(x):
    x[0].zero_()
    return (x.diagonal(),)


def _copy_then_movedim(x):
    x.copy_(x * 2)
    return (x.movedim(1, 0),)


VIEWS_OF_MUTATED_INPUTS = {  # (function, input, dynamic shapes)
    "relu_then_transpose": (_relu_then_transpose, lambda: torch.randn(4, 5), False),
    "scale_then_expand": (_scale_then_expand, lambda: torch.randn(3, 4), False),
    "scale_then_expand_dynamic": (_scale_then_expand, lambda: torch.randn(3, 4), True),
    "zero_row_then_diagonal": (_zero_row_then_diagonal, lambda: torch.randn(4, 4), False),
    "copy_then_movedim_transposed": (_copy_then_movedim, lambda: transposed(torch.randn(3, 4, 5)), False),
}


@pytest.mark.parametrize("name", sorted(VIEWS_OF_MUTATED_INPUTS))
def test_views_of_mutated_inputs_alias_the_input(name):
    fn, make, dynamic = VIEWS_OF_MUTATED_INPUTS[name]
    x = make()
    eager_x, kiln_x = x.clone(memory_format=torch.preserve_format), x.clone(memory_format=torch.preserve_format)
    want = fn(eager_x)
    got = compiled_outputs(fn, kiln_x, dynamic=dynamic)
    assert_like_eager(got, want)
    torch.testing.assert_close(kiln_x, eager_x)
    view = got[0]
    assert view.untyped_storage().data_ptr() == kiln_x.untyped_storage().data_ptr()
    assert view.storage_offset() == want[0].storage_offset()


def test_training_output_views_of_inputs_get_gradients():
    """A training graph returns a view of an input as eager does (a view of it, with grads)."""
    def fn(x):
        return x.t(), (x * 2).sum()

    x = torch.randn(4, 5, requires_grad=True)
    eager_x = x.detach().clone().requires_grad_()
    got, want = compiled_outputs(fn, x), fn(eager_x)
    assert_like_eager(got, want)
    assert got[0]._base is x
    (got[0] * torch.arange(20.0).reshape(5, 4)).sum().backward()
    (want[0] * torch.arange(20.0).reshape(5, 4)).sum().backward()
    torch.testing.assert_close(x.grad, eager_x.grad)


def test_training_returns_expanded_outputs_as_eagers_stride_0_views():
    """In training an expanded output is a view of its intermediate, as eager's: an
    `autograd.Function`'s output that is a view cannot be modified in place, and neither can an
    expand in eager (its elements overlap)."""
    def fn(x):
        return (torch.sin(x) * 2).unsqueeze(0).expand(2, *x.shape)

    x = torch.randn(3, 4, requires_grad=True)
    eager_x = x.detach().clone().requires_grad_()
    (got,), want = compiled_outputs(fn, x), fn(eager_x)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride() == (0, 4, 1)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(x.grad, eager_x.grad)


def transposed_2d(shape: tuple[int, int]) -> torch.Tensor:
    return torch.randn(shape[::-1]).t()


# Outputs whose decomposition ends in an op laid out otherwise than the op it replaced
# (`group_norm` -> a `view` of a contiguous value, `log_softmax` -> pointwise ops following a
# transposed input where eager's is contiguous).
DECOMPOSED_LAYOUTS = {
    "roll_transposed": (lambda x: x.roll(1, -1), lambda: transposed_2d((4, 7)), False),
    "group_norm_channels_last": (lambda x: torch.nn.functional.group_norm(x, 1),
                                 lambda: torch.randn(3, 3, 5, 7).contiguous(memory_format=torch.channels_last), False),
    "log_softmax_transposed_movedim": (lambda x: torch.log_softmax(x + x, -2).movedim(-2, -1),
                                       lambda: transposed_2d((7, 4)), True),
}


@pytest.mark.parametrize("name", sorted(DECOMPOSED_LAYOUTS))  # roll: decomp's retrace gives eager's layout
def test_decomposed_outputs_keep_the_layout_of_the_op_they_replace(name):
    fn, make, dynamic = DECOMPOSED_LAYOUTS[name]
    x = make()
    assert_like_eager(compiled_outputs(fn, x.clone(memory_format=torch.preserve_format), dynamic=dynamic), (fn(x),))


def test_expand_of_a_value_the_decomp_stage_merged():
    """Two equal casts merged into one node (each kept its fake): the expand of one still views it."""
    def fn(x):
        first = x.max(-2, keepdim=True)[1].float()
        second = x.max(-2, keepdim=True)[1].float()
        return second.unsqueeze(0).expand(2, *second.shape), torch.erf(first)

    x = torch.randn(5, 8)
    assert_like_eager(compiled_outputs(fn, x.clone(), dynamic=True), fn(x))
