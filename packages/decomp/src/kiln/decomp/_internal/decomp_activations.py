"""kiln decompositions of softmax, log_softmax, gelu, silu, hardswish and their backward ops.

Each is written as the few loop-level ops a fusing backend wants: one max and one sum
reduction for softmax, pointwise math for the activations, computing in float32 for
float16/bfloat16 inputs as eager's CPU kernels do, and converting back once at the end.
"""

from __future__ import annotations

import logging
import math

import torch

from .registry import aten, decomposes, scalar, to_dtype, upcast

log = logging.getLogger(__name__)


def _softmax_out_dtype(x: torch.Tensor, half_to_float: bool) -> torch.dtype:
    return torch.float32 if half_to_float else x.dtype


@decomposes(aten._softmax.default)
def softmax(self, dim, half_to_float):
    """exp(x - max) / sum(exp(x - max)) along ``dim``."""
    if not self.is_floating_point():
        return NotImplemented
    x = upcast(self)
    if x.numel() == 0:
        return to_dtype(aten.exp.default(x), _softmax_out_dtype(self, half_to_float))
    shifted = aten.sub.Tensor(x, aten.amax.default(x, [dim], True))
    unnormalized = aten.exp.default(shifted)
    out = aten.div.Tensor(unnormalized, aten.sum.dim_IntList(unnormalized, [dim], True))
    return to_dtype(out, _softmax_out_dtype(self, half_to_float))


@decomposes(aten._log_softmax.default)
def log_softmax(self, dim, half_to_float):
    """(x - max) - log(sum(exp(x - max))) along ``dim``."""
    if not self.is_floating_point():
        return NotImplemented
    x = upcast(self)
    if x.numel() == 0:
        return to_dtype(x, _softmax_out_dtype(self, half_to_float))
    shifted = aten.sub.Tensor(x, aten.amax.default(x, [dim], True))
    total = aten.sum.dim_IntList(aten.exp.default(shifted), [dim], True)
    out = aten.sub.Tensor(shifted, aten.log.default(total))
    return to_dtype(out, _softmax_out_dtype(self, half_to_float))


@decomposes(aten._softmax_backward_data.default)
def softmax_backward(grad_output, output, dim, input_dtype):
    """y * (g - sum(g * y)) along ``dim``."""
    g, y = upcast(grad_output), upcast(output)
    dot = aten.sum.dim_IntList(aten.mul.Tensor(g, y), [dim], True)
    return to_dtype(aten.mul.Tensor(y, aten.sub.Tensor(g, dot)), input_dtype)


@decomposes(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad_output, output, dim, input_dtype):
    """g - exp(y) * sum(g) along ``dim``."""
    g, y = upcast(grad_output), upcast(output)
    total = aten.sum.dim_IntList(g, [dim], True)
    return to_dtype(aten.sub.Tensor(g, aten.mul.Tensor(aten.exp.default(y), total)), input_dtype)


_SQRT_HALF = math.sqrt(0.5)
_TANH_SCALE = math.sqrt(2.0 / math.pi)  # sqrt(2 / pi)
_TANH_CUBIC = 0.044715
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _gelu_tanh_inner(x: torch.Tensor) -> torch.Tensor:
    cube = aten.mul.Tensor(aten.mul.Tensor(x, x), x)
    return aten.mul.Scalar(aten.add.Tensor(x, aten.mul.Scalar(cube, _TANH_CUBIC)), _TANH_SCALE)


@decomposes(aten.gelu.default)
def gelu(self, *, approximate="none"):
    """x * Phi(x): erf form, or the tanh approximation when ``approximate="tanh"``."""
    if not self.is_floating_point() or approximate not in ("none", "tanh"):
        return NotImplemented
    x = upcast(self)
    if approximate == "tanh":
        cdf = aten.add.Scalar(aten.tanh.default(_gelu_tanh_inner(x)), 1.0)
    else:
        cdf = aten.add.Scalar(aten.erf.default(aten.mul.Scalar(x, _SQRT_HALF)), 1.0)
    return to_dtype(aten.mul.Tensor(aten.mul.Scalar(x, 0.5), cdf), self.dtype)


@decomposes(aten.gelu_backward.default)
def gelu_backward(grad_output, self, *, approximate="none"):
    """g * d/dx gelu(x), for either form."""
    if not self.is_floating_point() or approximate not in ("none", "tanh"):
        return NotImplemented
    x, g = upcast(self), upcast(grad_output)
    if approximate == "tanh":
        t = aten.tanh.default(_gelu_tanh_inner(x))
        x_squared = aten.mul.Tensor(x, x)
        inner_slope = aten.mul.Scalar(
            aten.add.Scalar(aten.mul.Scalar(x_squared, 3 * _TANH_CUBIC), 1.0), _TANH_SCALE
        )
        sech_squared = aten.sub.Tensor(scalar(1.0, t), aten.mul.Tensor(t, t))
        slope = aten.add.Tensor(
            aten.mul.Scalar(aten.add.Scalar(t, 1.0), 0.5),
            aten.mul.Tensor(aten.mul.Scalar(x, 0.5), aten.mul.Tensor(sech_squared, inner_slope)),
        )
    else:
        cdf = aten.mul.Scalar(
            aten.add.Scalar(aten.erf.default(aten.mul.Scalar(x, _SQRT_HALF)), 1.0), 0.5
        )
        pdf = aten.mul.Scalar(
            aten.exp.default(aten.mul.Scalar(aten.mul.Tensor(x, x), -0.5)), _INV_SQRT_2PI
        )
        slope = aten.add.Tensor(cdf, aten.mul.Tensor(x, pdf))
    return to_dtype(aten.mul.Tensor(g, slope), grad_output.dtype)


@decomposes(aten.silu.default)
def silu(self):
    """x * sigmoid(x)."""
    if not self.is_floating_point():
        return NotImplemented
    x = upcast(self)
    return to_dtype(aten.mul.Tensor(x, aten.sigmoid.default(x)), self.dtype)


@decomposes(aten.silu_backward.default)
def silu_backward(grad_output, self):
    """g * s * (1 + x * (1 - s)) with s = sigmoid(x)."""
    x, g = upcast(self), upcast(grad_output)
    s = aten.sigmoid.default(x)
    one_minus = aten.sub.Tensor(scalar(1.0, s), s)
    slope = aten.mul.Tensor(s, aten.add.Scalar(aten.mul.Tensor(x, one_minus), 1.0))
    return to_dtype(aten.mul.Tensor(g, slope), grad_output.dtype)


@decomposes(aten.hardswish.default)
def hardswish(self):
    """x * min(max(x + 3, 0), 6) / 6 (NaN propagates like eager)."""
    if not self.is_floating_point():
        return NotImplemented
    x = upcast(self)
    relu6 = aten.minimum.default(
        aten.maximum.default(aten.add.Scalar(x, 3.0), scalar(0.0, x)), scalar(6.0, x)
    )
    return to_dtype(aten.div.Scalar(aten.mul.Tensor(x, relu6), 6.0), self.dtype)


@decomposes(aten.hardswish_backward.default)
def hardswish_backward(grad_output, self):
    """0 up to -3, g * (x / 3 + 0.5) below 3, g from 3 on and for NaN (eager's order)."""
    x, g = upcast(self), upcast(grad_output)
    middle = aten.mul.Tensor(g, aten.add.Scalar(aten.div.Scalar(x, 3.0), 0.5))
    upper = aten.where.self(aten.lt.Scalar(x, 3.0), middle, g)
    out = aten.where.self(aten.le.Scalar(x, -3.0), scalar(0.0, g), upper)
    return to_dtype(out, grad_output.dtype)


ACTIVATION_DECOMPOSITIONS = (
    softmax,
    log_softmax,
    softmax_backward,
    log_softmax_backward,
    gelu,
    gelu_backward,
    silu,
    silu_backward,
    hardswish,
    hardswish_backward,
)
