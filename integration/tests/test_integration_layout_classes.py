"""Outputs keep eager's significant strides in the classes the differential fuzzer found wrong
(issue 19, session 11): each case is a shrunk fuzz program, named by its seed."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend, explain

CHANNELS_LAST = torch.channels_last


def _transposed(*shape):
    return torch.randn(*shape).transpose(-1, -2).contiguous().transpose(-1, -2)


def sliced_cast(x):
    # 28000302: the cast's fake strides read `s25*Max(1, (s63 + 1)//2)`; not seen as dense,
    # the output was stored contiguously
    return (x[..., ::2].double(),)


def group_norm(x):
    # 28000923: the decomposition ends in a view whose fake spells a size `(s10**2)//s10`, so the
    # output was not given group_norm's channels-last fake
    return (torch.nn.functional.group_norm(x, 1),)


def selected_group_norm(x):
    # 28000786: a select of a channels-last value has gaps; symbolic gaps were refused
    return (torch.nn.functional.group_norm(x, 1).select(2, 0),)


def sliced_transposed_add(x):
    # 28000983: `add`'s fake strides `(1, Max(1, s86 - 1))`
    return (torch.minimum(x, x)[1:] + 1,)


def pointwise_of_roll(x):
    # 28001892, 28001924: torch's roll is contiguous, eager's CPU roll channels-last, and the
    # ops computed from it followed the meta's layout
    rolled = x.roll(1, 0)
    return rolled, torch.addcmul(rolled, rolled, rolled, value=0.5), torch.sigmoid(rolled).float()


def clamped_roll(x):
    # 22001147: an in-place clamp_ of a channels-last roll, returned
    rolled = x.roll(1, -4)
    rolled.clamp_(-1, 1)
    return (rolled,)


def lerp_of_written_input(x, y):
    # 26001221: the functional copy of `y.copy_(...)` was contiguous, and lerp follows its first
    # operand
    y.copy_(y * 2)
    return (torch.lerp(y, x, 0.3),)


def lerp_of_group_norm(x):
    # 38000308: kiln's group_norm decomposition is laid out contiguously (eager's CPU kernel keeps
    # channels-last), and torch's lerp decomposition ends in a copy_strided to the layout of its
    # operands as the retrace saw them: contiguous, run in eager after the region
    return (torch.lerp(torch.nn.functional.group_norm(x, 1), x, 0.3),)


def layer_norm_of_roll(x):
    # 39000458: the recorded fakes of what is computed from a channels-last roll follow roll's
    # contiguous meta, so the layer_norm's decomposition (pointwise, channels-last) went
    # uncorrected; eager's layer_norm is contiguous (the meta on the retraced inputs says so)
    rolled = x.roll(1, 2)
    return (torch.nn.functional.layer_norm(rolled, rolled.shape[-1:]), rolled)


def roll_moving_nothing(x):
    # 39000458: eager's CPU roll cats the two parts of the dim; a shift that is a multiple of
    # the size leaves one empty and the result contiguous
    return (x.roll(1, 0), x.roll(4, 2), x.roll((1, 4), (1, 3)))


CASES = {
    "sliced_cast": (sliced_cast, lambda: [_transposed(5, 4, 7, 3)], [True]),
    "group_norm": (group_norm, lambda: [torch.randn(7, 7, 7, 1).to(memory_format=CHANNELS_LAST)], [True]),
    "selected_group_norm": (selected_group_norm,
                            lambda: [torch.randn(2, 2, 2, 4).to(memory_format=CHANNELS_LAST)], [True]),
    "sliced_transposed_add": (sliced_transposed_add, lambda: [_transposed(8, 5)], [True]),
    "pointwise_of_roll": (pointwise_of_roll, lambda: [torch.randn(2, 7, 7, 4).to(memory_format=CHANNELS_LAST)],
                          [False, True]),
    "clamped_roll": (clamped_roll, lambda: [torch.randn(5, 5, 4, 1).to(memory_format=CHANNELS_LAST)], [False]),
    "lerp_of_written_input": (lerp_of_written_input,
                              lambda: [torch.randn(4, 4, 2, 4).to(memory_format=CHANNELS_LAST) for _ in range(2)],
                              [False, True]),
    "lerp_of_group_norm": (lerp_of_group_norm, lambda: [torch.randn(5, 3, 2, 2).to(memory_format=CHANNELS_LAST)],
                           [False, True]),
    "layer_norm_of_roll": (layer_norm_of_roll, lambda: [torch.randn(1, 5, 4, 4).to(memory_format=CHANNELS_LAST)],
                           [False, True]),
    "roll_moving_nothing": (roll_moving_nothing,
                            lambda: [torch.randn(1, 5, 4, 4).to(memory_format=CHANNELS_LAST)], [False]),
}
PARAMS = [pytest.param(name, dynamic, id=f"{name}-{'dynamic' if dynamic else 'static'}")
          for name, (_, _, dynamics) in CASES.items() for dynamic in dynamics]


@pytest.mark.parametrize(("name", "dynamic"), PARAMS)
def test_outputs_have_eagers_significant_strides(name, dynamic):
    fn, make_inputs, _ = CASES[name]
    options = {"fallback": False, "codegen": "reference"}
    torch._dynamo.reset()
    with torch._dynamo.config.patch(assume_static_by_default=not dynamic):
        assert explain(fn, *make_inputs(), options=options).kernel_count >= 1
    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=dynamic or None,
                             backend=lambda gm, ex: backend(gm, ex, options=options))
    inputs = make_inputs()
    expected_inputs = [t.clone(memory_format=torch.preserve_format) for t in inputs]
    expected = fn(*expected_inputs)
    got = compiled(*inputs)
    for g, e in zip([*got, *inputs], [*expected, *expected_inputs]):
        torch.testing.assert_close(g, e)
        same, dim = torch._prims_common.check_significant_strides(g, e, only_cuda=False)
        assert same, f"{name}: strides {g.stride()} where eager gives {e.stride()} (dim {dim})"


def test_a_roll_without_dims_stays_contiguous_as_eagers():
    # eager rolls the flattened tensor: contiguous, whatever the input's layout
    x = torch.randn(2, 3, 4, 5).to(memory_format=CHANNELS_LAST)
    options = {"fallback": False, "codegen": "reference"}
    torch._dynamo.reset()

    def rolls(x):
        return x.roll(3), x.roll(3) + 1

    compiled = torch.compile(rolls, backend=lambda gm, ex: backend(gm, ex, options=options))
    for got, expected in zip(compiled(x), rolls(x)):
        torch.testing.assert_close(got, expected)
        assert got.stride() == expected.stride() == (60, 20, 5, 1)
