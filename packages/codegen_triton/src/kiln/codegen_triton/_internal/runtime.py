"""Calling generated kernels: check inputs, allocate outputs, pick block sizes, launch."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import Kernel, Reduction

from .kernel_source import has_reduction
from .options import TritonCodegenError, TritonOptions
from .printer import python_expr

log = logging.getLogger(__name__)


def _host_function(kernel: Kernel, rows: Sequence[Sequence[sympy.Expr]]) -> Callable[..., list[tuple[int, ...]]]:
    """A Python function: symbol values -> one tuple of ints per row of size expressions."""
    params = ", ".join(s.name for s in kernel.symbols)
    body = ", ".join("(" + "".join(python_expr(e) + ", " for e in row) + ")" for row in rows)
    return eval(f"lambda {params}: [{body}]", {"max": max, "min": min})  # noqa: S307 (our printed exprs)


def _block(work: int, cap: int) -> int:
    """The next power of two of `work`, at most `cap`."""
    return min(cap, 1 << max(work - 1, 0).bit_length())


def _numel(sizes: Sequence[sympy.Expr]) -> sympy.Expr:
    return sympy.Mul(*sizes) if sizes else sympy.Integer(1)


class TritonKernel:
    """`kernel(*inputs, *symbol_values) -> tuple(outputs)`, launching a generated Triton kernel."""

    def __init__(self, kernel: Kernel, jit_function: Any, options: TritonOptions) -> None:
        self.__name__ = kernel.name
        self.kernel = kernel
        self.jit_function = jit_function
        self.options = options
        self.reduction = has_reduction(kernel)
        rnumels = [_numel(n.reduction_ranges) for n in kernel.nodes if isinstance(n.body, Reduction)]
        self._outputs = _host_function(kernel, [o.size for o in kernel.outputs] +
                                       [o.stride for o in kernel.outputs])
        self._work = _host_function(kernel, [[_numel(kernel.ranges)] + rnumels])
        self._input_layouts = _host_function(kernel, [i.size for i in kernel.inputs] +
                                             [i.stride for i in kernel.inputs])

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        n_in = len(self.kernel.inputs)
        if len(args) != n_in + len(self.kernel.symbols):
            raise TypeError(f"{self.__name__} takes {n_in} tensors and {len(self.kernel.symbols)} "
                            f"sizes, got {len(args)} arguments")
        inputs, sizes = args[:n_in], [int(s) for s in args[n_in:]]
        if self.options.check_inputs:
            self._check(inputs, sizes)
        device = inputs[0].device if inputs else self._default_device()
        shapes = self._outputs(*sizes)
        n_out = len(self.kernel.outputs)
        outputs = tuple(torch.empty_strided(size, stride, dtype=spec.dtype, device=device)
                        for size, stride, spec in zip(shapes[:n_out], shapes[n_out:], self.kernel.outputs))
        xnumel, *rnumels = self._work(*sizes)[0]
        if xnumel == 0:
            return outputs
        launch: dict[str, int] = {"num_warps": self.options.num_warps}
        if self.reduction:
            launch["XBLOCK"] = _block(xnumel, self.options.reduction_xblock)
            launch["RBLOCK"] = _block(max(rnumels, default=1), self.options.rblock)
        else:
            launch["XBLOCK"] = _block(xnumel, self.options.xblock)
        grid = (-(-xnumel // launch["XBLOCK"]),)
        self.jit_function[grid](*inputs, *outputs, *sizes, **launch)
        return outputs

    def _default_device(self) -> torch.device:
        """Where a kernel without tensor inputs allocates: loopir's specs carry no device yet."""
        if self.options.device is not None:
            return torch.device(self.options.device)
        interpreted = type(self.jit_function).__name__ == "InterpretedFunction"
        return torch.device("cuda" if torch.cuda.is_available() and not interpreted else "cpu")

    def _check(self, inputs: Sequence[torch.Tensor], sizes: list[int]) -> None:
        device = inputs[0].device if inputs else None
        layouts = self._input_layouts(*sizes)
        n_in = len(inputs)
        for tensor, size, stride, spec in zip(inputs, layouts[:n_in], layouts[n_in:], self.kernel.inputs):
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != spec.dtype or tensor.device != device:
                got = f"{tensor.dtype} on {tensor.device}" if isinstance(tensor, torch.Tensor) else type(tensor)
                raise TritonCodegenError(f"{self.__name__}: input {spec.name} must be a {spec.dtype} tensor "
                                         f"on {device}, got {got}")
            if tuple(tensor.shape) != size:
                raise TritonCodegenError(f"{self.__name__}: input {spec.name} has sizes {tuple(tensor.shape)}, "
                                         f"but the size arguments {sizes} give {size}")
            if any(st != e for st, e, n in zip(tensor.stride(), stride, tensor.shape) if n > 1):
                raise TritonCodegenError(f"{self.__name__}: input {spec.name} has strides {tensor.stride()}, "
                                         f"but the kernel was generated for {stride}")

    def __repr__(self) -> str:
        return f"<Triton kernel {self.__name__}>"
