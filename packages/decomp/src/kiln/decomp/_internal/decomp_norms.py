"""kiln decompositions of layer_norm, group_norm and batch_norm, forward and backward.

All three normalise ``x`` over some dims: ``x_hat = (x - mean) * rsqrt(var + eps)``, with
two-pass mean/variance (``mean``, ``sub``, ``mul``, ``mean``), then an affine
per-feature (layer norm) or per-channel (group / batch norm) scale and shift. The
backward ops use the closed form ``rstd * (g - mean(g) - x_hat * mean(g * x_hat))``
(``g`` the incoming gradient times the weight), with sums for the weight and bias
gradients. float16/bfloat16 inputs compute in float32. Ops whose eager kernel writes
into its running-statistics arguments are left to functionalization (NotImplemented).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from .registry import aten, decomposes, sum_dims, to_dtype, upcast, zeros

log = logging.getLogger(__name__)


def _normalize(x: torch.Tensor, dims: list[int], eps: float) -> tuple[Any, Any, Any, Any]:
    """(x_hat, mean, rstd, biased var) over ``dims``, statistics with keepdim."""
    mean = aten.mean.dim(x, dims, True)
    diff = aten.sub.Tensor(x, mean)
    var = aten.mean.dim(aten.mul.Tensor(diff, diff), dims, True)
    rstd = aten.rsqrt.default(aten.add.Scalar(var, eps))
    return aten.mul.Tensor(diff, rstd), mean, rstd, var


def _input_grad(g: torch.Tensor, x_hat: torch.Tensor, rstd: Any, dims: list[int]) -> Any:
    """rstd * (g - mean(g) - x_hat * mean(g * x_hat)) over ``dims``."""
    g_mean = aten.mean.dim(g, dims, True)
    proj = aten.mean.dim(aten.mul.Tensor(g, x_hat), dims, True)
    centered = aten.sub.Tensor(aten.sub.Tensor(g, g_mean), aten.mul.Tensor(x_hat, proj))
    return aten.mul.Tensor(centered, rstd)


def _affine(out: Any, weight: Any, bias: Any, shape: list[Any] | None = None) -> Any:
    """out * weight + bias, the parameters viewed as ``shape`` (for channel broadcast)."""
    if weight is not None:
        w = upcast(weight) if shape is None else aten.view.default(upcast(weight), shape)
        out = aten.mul.Tensor(out, w)
    if bias is not None:
        b = upcast(bias) if shape is None else aten.view.default(upcast(bias), shape)
        out = aten.add.Tensor(out, b)
    return out


def _saved_stat(stat: Any, input: torch.Tensor, cast_on: tuple[str, ...]) -> Any:
    """A mean/rstd the backward reads, in eager's dtype: the input's on devices in `cast_on`,
    else the compute dtype (float32 for float16/bfloat16 inputs). The graph that saves it and the
    graph that reads it back are traced apart (forward and backward), each with eager's dtype."""
    return to_dtype(stat, input.dtype) if input.device.type in cast_on else stat


# ----------------------------------------------------------------------------- layer norm


@decomposes(aten.native_layer_norm.default)
def layer_norm(input, normalized_shape, weight, bias, eps):
    """Normalise over the trailing ``normalized_shape`` dims; mean/rstd keep them as 1s."""
    if not input.is_floating_point():
        return NotImplemented
    axis = input.dim() - len(normalized_shape)
    dims = list(range(axis, input.dim()))
    x_hat, mean, rstd, _ = _normalize(upcast(input), dims, eps)
    out = _affine(x_hat, weight, bias)
    # eager's CUDA kernel returns float32 statistics for float16/bfloat16 inputs, its CPU one the input's dtype
    return (to_dtype(out, input.dtype), _saved_stat(mean, input, ("cpu", "mtia")),
            _saved_stat(rstd, input, ("cpu", "mtia")))


@decomposes(aten.native_layer_norm_backward.default)
def layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    """Gradients of layer_norm for the outputs ``output_mask`` asks for (others None)."""
    axis = input.dim() - len(normalized_shape)
    inner = list(range(axis, input.dim()))
    outer = list(range(axis))
    g = upcast(grad_out)
    x_hat = aten.mul.Tensor(aten.sub.Tensor(upcast(input), upcast(mean)), upcast(rstd))
    d_input = d_weight = d_bias = None
    if output_mask[0]:
        scaled = g if weight is None else aten.mul.Tensor(g, upcast(weight))
        d_input = to_dtype(_input_grad(scaled, x_hat, upcast(rstd), inner), input.dtype)
    if output_mask[1] and weight is not None:
        d_weight = to_dtype(sum_dims(aten.mul.Tensor(g, x_hat), outer), weight.dtype)
    if output_mask[2] and bias is not None:
        d_bias = to_dtype(sum_dims(g, outer), bias.dtype)
    return d_input, d_weight, d_bias


# ----------------------------------------------------------------------------- group norm


@decomposes(aten.native_group_norm.default)
def group_norm(input, weight, bias, N, C, HxW, group, eps):
    """Normalise each of ``group`` channel groups; mean/rstd are (N, group)."""
    if not input.is_floating_point():
        return NotImplemented
    grouped = aten.reshape.default(upcast(input), [N, group, (C // group) * HxW])
    x_hat, mean, rstd, _ = _normalize(grouped, [2], eps)
    out = aten.view.default(x_hat, list(input.shape))
    out = _affine(out, weight, bias, [1, C] + [1] * (input.dim() - 2))
    mean = aten.squeeze.dims(mean, [2])
    rstd = aten.squeeze.dims(rstd, [2])
    return to_dtype(out, input.dtype), to_dtype(mean, input.dtype), to_dtype(rstd, input.dtype)


@decomposes(aten.native_group_norm_backward.default)
def group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask):
    """Gradients of group_norm, on (N, group, C // group, HxW) views."""
    per_group = [N, group, C // group, HxW]
    x = aten.reshape.default(upcast(input), per_group)
    g = aten.reshape.default(upcast(grad_out), per_group)
    mean4 = aten.view.default(upcast(mean), [N, group, 1, 1])
    rstd4 = aten.view.default(upcast(rstd), [N, group, 1, 1])
    x_hat = aten.mul.Tensor(aten.sub.Tensor(x, mean4), rstd4)
    d_input = d_weight = d_bias = None
    if output_mask[0]:
        scaled = g
        if weight is not None:
            scaled = aten.mul.Tensor(
                g, aten.view.default(upcast(weight), [1, group, C // group, 1])
            )
        d_input = _input_grad(scaled, x_hat, rstd4, [2, 3])
        d_input = to_dtype(aten.view.default(d_input, list(input.shape)), input.dtype)
    if output_mask[1]:
        d_weight = aten.sum.dim_IntList(aten.mul.Tensor(g, x_hat), [0, 3])
        d_weight = to_dtype(aten.view.default(d_weight, [C]), input.dtype)
    if output_mask[2]:
        d_bias = to_dtype(aten.view.default(aten.sum.dim_IntList(g, [0, 3]), [C]), input.dtype)
    return d_input, d_weight, d_bias


# ----------------------------------------------------------------------------- batch norm


def _channel_shape(x: torch.Tensor) -> list[Any]:
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


def _channel_dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def _batch_stats(input, weight, bias, eps):  # noqa: ANN001, ANN202
    """Training-mode batch norm: (out, mean (C), rstd (C), biased var (C)) in compute dtype."""
    dims = _channel_dims(input)
    x_hat, mean, rstd, var = _normalize(upcast(input), dims, eps)
    out = _affine(x_hat, weight, bias, _channel_shape(input))
    mean, rstd, var = (aten.squeeze.dims(t, dims) for t in (mean, rstd, var))
    return out, mean, rstd, var


def _running_norm(input, weight, bias, running_mean, running_var, eps):  # noqa: ANN001, ANN202
    """Inference-mode batch norm with the running statistics, in compute dtype."""
    shape = _channel_shape(input)
    mean = aten.view.default(upcast(running_mean), shape)
    rstd = aten.rsqrt.default(aten.add.Scalar(aten.view.default(upcast(running_var), shape), eps))
    out = aten.mul.Tensor(aten.sub.Tensor(upcast(input), mean), rstd)
    return _affine(out, weight, bias, shape)


def _updated(running: torch.Tensor, batch: Any, momentum: float) -> Any:
    """(1 - momentum) * running + momentum * batch, in the running tensor's dtype."""
    blended = aten.add.Tensor(
        aten.mul.Scalar(upcast(running), 1.0 - momentum), aten.mul.Scalar(batch, momentum)
    )
    return to_dtype(blended, running.dtype)


def _empty_stat(input: torch.Tensor) -> Any:
    return zeros([0], input, upcast(input).dtype)


@decomposes(aten._native_batch_norm_legit_no_training.default)
def batch_norm_inference(input, weight, bias, running_mean, running_var, momentum, eps):
    """Inference batch norm: (out, empty, empty) like eager."""
    if not input.is_floating_point():
        return NotImplemented
    out = _running_norm(input, weight, bias, running_mean, running_var, eps)
    return to_dtype(out, input.dtype), _empty_stat(input), _empty_stat(input)


@decomposes(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm that returns the updated running statistics instead of writing them."""
    if not input.is_floating_point():
        return NotImplemented
    if not training:
        out = _running_norm(input, weight, bias, running_mean, running_var, eps)
        return (
            to_dtype(out, input.dtype),
            _empty_stat(input),
            _empty_stat(input),
            aten.clone.default(running_mean),
            aten.clone.default(running_var),
        )
    out, mean, rstd, var = _batch_stats(input, weight, bias, eps)
    count = math.prod(input.shape) // input.shape[1]
    # var * n / (n - 1): a single value per channel gives inf, as in eager
    unbiased = aten.div.Scalar(aten.mul.Scalar(var, count), count - 1)
    new_mean = _updated(running_mean, mean, momentum)
    new_var = _updated(running_var, unbiased, momentum)
    return to_dtype(out, input.dtype), _saved_stat(mean, input, ("cpu",)), _saved_stat(rstd, input, ("cpu",)), \
        new_mean, new_var


@decomposes(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """native_batch_norm: inference, training without running statistics, or training
    with them, where eager updates the statistics in place: the new values are written
    with ``aten.copy_`` into the tensors passed in (an input write-back when they are graph
    inputs, as functionalization writes them)."""
    if not input.is_floating_point():
        return NotImplemented
    if not training and running_mean is not None and running_var is not None:
        out = _running_norm(input, weight, bias, running_mean, running_var, eps)
        return to_dtype(out, input.dtype), _empty_stat(input), _empty_stat(input)
    if training and running_mean is None and running_var is None:
        return batch_norm_no_stats(input, weight, bias, training, momentum, eps)
    if training and running_mean is not None and running_var is not None:
        out, mean, rstd, new_mean, new_var = batch_norm_functional(
            input, weight, bias, running_mean, running_var, True, momentum, eps
        )
        aten.copy_.default(running_mean, new_mean)
        aten.copy_.default(running_var, new_var)
        return out, mean, rstd
    return NotImplemented


@decomposes(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(input, weight, bias, training, momentum, eps):
    """Training batch norm without running statistics: (out, mean, rstd)."""
    if not input.is_floating_point() or not training:
        return NotImplemented
    out, mean, rstd, _ = _batch_stats(input, weight, bias, eps)
    return to_dtype(out, input.dtype), _saved_stat(mean, input, ("cpu",)), _saved_stat(rstd, input, ("cpu",))


@decomposes(aten.native_batch_norm_backward.default)
def batch_norm_backward(
    grad_out,
    input,
    weight,
    running_mean,
    running_var,
    save_mean,
    save_invstd,
    train,
    eps,
    output_mask,
):
    """Gradients of batch norm, training (saved batch statistics) or inference (running)."""
    if train:
        mean, invstd = upcast(save_mean), upcast(save_invstd)
    elif running_mean is None or running_var is None:
        return NotImplemented
    else:
        mean = upcast(running_mean)
        invstd = aten.rsqrt.default(aten.add.Scalar(upcast(running_var), eps))
    shape, dims = _channel_shape(input), _channel_dims(input)
    mean, invstd = aten.view.default(mean, shape), aten.view.default(invstd, shape)
    g = upcast(grad_out)
    x_hat = aten.mul.Tensor(aten.sub.Tensor(upcast(input), mean), invstd)
    d_input = d_weight = d_bias = None
    if output_mask[0]:
        scaled = (
            g if weight is None else aten.mul.Tensor(g, aten.view.default(upcast(weight), shape))
        )
        d_input = (
            _input_grad(scaled, x_hat, invstd, dims) if train else aten.mul.Tensor(scaled, invstd)
        )
        d_input = to_dtype(d_input, input.dtype)
    param_dtype = input.dtype if weight is None else weight.dtype
    if output_mask[1]:
        d_weight = to_dtype(aten.sum.dim_IntList(aten.mul.Tensor(g, x_hat), dims), param_dtype)
    if output_mask[2]:
        d_bias = to_dtype(aten.sum.dim_IntList(g, dims), param_dtype)
    return d_input, d_weight, d_bias


NORM_DECOMPOSITIONS = (
    layer_norm,
    layer_norm_backward,
    group_norm,
    group_norm_backward,
    batch_norm_inference,
    batch_norm_functional,
    batch_norm_no_stats,
    batch_norm,
    batch_norm_backward,
)
