"""Values computed outside the regions (an ATen call kiln leaves to eager, here a convolution)
that die in a region are overwritten by its kernel's output (`input_writes.request_donations`,
loopir's `input_stores.py`), as Inductor reuses the buffer: results stay eager's, the caller's
tensors are never written, and a value something else still reads is never taken."""

import pytest
import torch

from kiln.integration import backend
from kiln.integration._internal import conv_batch_norm
from kiln.loopir._internal import graph_runtime, input_stores

CODEGENS = ["cpu", "cuda"]  # codegen_cpp; codegen_triton (Triton's interpreter on CPU tensors)
WRITTEN = []  # per stored_inputs call: whether each input was written by its kernel itself


@pytest.fixture(autouse=True)
def record_stored_inputs(monkeypatch):
    WRITTEN.clear()
    original = graph_runtime.stored_inputs

    def recorded(tensors, written):
        WRITTEN.append([value is tensor or graph_runtime._same_elements(value, tensor)
                        for tensor, value in zip(tensors, written)])
        return original(tensors, written)

    monkeypatch.setattr(graph_runtime, "stored_inputs", recorded)
    monkeypatch.setattr(input_stores, "stored_inputs", recorded)
    # the donations themselves are under test: channels-last CPU conv + batch norm would
    # otherwise be one oneDNN call with nothing left to donate to (test_integration_conv_batch_norm.py)
    monkeypatch.setattr(conv_batch_norm, "ENABLED", False)


class ConvBnRelu(torch.nn.Module):
    def __init__(self, also_conv: bool = False):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.also_conv = also_conv

    def forward(self, x):
        y = self.conv(x)
        out = torch.relu(self.bn(y))
        return (out, y) if self.also_conv else out


def _compiled(fn, codegen, reports):
    def compile_graph(gm, example_inputs):
        module = backend(gm, example_inputs, options={"codegen": codegen})  # the convolution stays ATen's
        reports.append(module)
        return module
    torch._dynamo.reset()
    return torch.compile(fn, backend=compile_graph)


def _image(channels_last):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 5)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_norm_and_relu_overwrite_the_dead_convolution_output(codegen, channels_last):
    model = ConvBnRelu().eval().to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    x = _image(channels_last)
    before = x.clone()
    compiled = _compiled(model, codegen, [])
    with torch.no_grad():
        for _ in range(2):
            got = compiled(x)
            want = model(x)
            torch.testing.assert_close(got, want)
            assert got.stride() == want.stride()
    assert WRITTEN and all(row == [True] for row in WRITTEN)  # the kernel wrote the convolution's output
    torch.testing.assert_close(x, before, rtol=0, atol=0)  # the caller's input untouched


@pytest.mark.parametrize("codegen", CODEGENS)
def test_a_value_the_graph_also_returns_is_not_taken(codegen):
    model = ConvBnRelu(also_conv=True).eval()
    x = _image(False)
    with torch.no_grad():
        out, y = _compiled(model, codegen, [])(x)
        want_out, want_y = model(x)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(y, want_y)  # not overwritten by the batch norm
    assert not WRITTEN


@pytest.mark.parametrize("codegen", CODEGENS)
def test_a_value_read_after_the_region_is_not_taken(codegen):
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)

    def fn(x):
        y = conv(x)
        z = torch.relu(y * 2 + 1)
        return torch.nn.functional.conv2d(z, conv.weight, padding=1) + y  # y read again after z's region

    x = _image(False)
    with torch.no_grad():
        got = _compiled(fn, codegen, [])(x)
        want = fn(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_only_fresh_values_of_aten_calls_are_offered():
    """A clone's result may be overwritten; a graph input, a view, or an `_unsafe_view` (which
    shares its input's memory though its schema does not say so) never."""
    from kiln.integration._internal.input_writes import _dies_here
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.randn(2, 3)
    made = {}
    for name, target, args in [("clone", aten.clone.default, (x,)), ("unsafe", aten._unsafe_view.default, (x, [3, 2])),
                               ("view", aten.view.default, (x, [3, 2]))]:
        made[name] = graph.call_function(target, args)
        made[name].meta["val"] = torch.randn(2, 3)
    call = graph.call_module("region", (x, *made.values()))
    graph.output(call)
    assert _dies_here(made["clone"], call)
    assert not any(_dies_here(made[name], call) for name in ("unsafe", "view")) and not _dies_here(x, call)


def test_a_donated_output_takes_no_allocation():
    """The output stored over the dead convolution value is that value's memory: the kernel's
    call allocates nothing for it (no pooled 256 KiB storage handed out and dropped per call)."""
    from kiln.codegen_cpp._internal.output_pool import POOL

    model = ConvBnRelu().eval()
    torch.manual_seed(0)
    x = torch.randn(2, 8, 64, 64)  # 256 KiB outputs: the pool's size class
    compiled = _compiled(model, "cpu", [])
    with torch.no_grad():
        compiled(x)
        handed = POOL.reused + POOL.added
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    assert WRITTEN and all(row == [True] for row in WRITTEN)
    assert POOL.reused + POOL.added == handed
