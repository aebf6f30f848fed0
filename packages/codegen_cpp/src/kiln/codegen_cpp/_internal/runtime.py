"""Calling compiled kernels: check inputs, allocate outputs, pass pointers and sizes through ctypes."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import Kernel, fill_requested, fill_uninitialized
from kiln.loopir.codegen import CheckSite, SizeFunction, raise_failed_check, scatter_bases


class _InputLayouts:
    """Expected sizes and strides of a kernel's inputs at given symbol values.

    An input may have a size symbol the kernel body never uses (e.g. the dimension a `select`
    removed); such a symbol is bound from the first input dimension it names, so every input
    that mentions it is checked against the same value.
    """

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        extra: dict[sympy.Symbol, tuple[int, int, str]] = {}
        for pos, spec in enumerate(kernel.inputs):
            for kind, exprs in (("size", spec.size), ("stride", spec.stride)):
                for dim, expr in enumerate(exprs):
                    if isinstance(expr, sympy.Symbol) and expr not in kernel.symbols:
                        extra.setdefault(expr, (pos, dim, kind))
        self.extra = list(extra.values())
        params = list(kernel.symbols) + list(extra)
        self.sizes = SizeFunction(params, [spec.size for spec in kernel.inputs], unknown_as_none=True)
        self.strides = SizeFunction(params, [spec.stride for spec in kernel.inputs], unknown_as_none=True)
        # Without size symbols every expected size and stride is known now: the per-call check
        # first compares whole tuples (fast); only a mismatch takes the detailed path, which
        # also accepts any stride on dims of size 1 and raises the precise error.
        self.exact: tuple[tuple[torch.dtype, torch.Size, tuple[int, ...]], ...] | None = None
        if not params:
            expected = list(zip(kernel.inputs, self.sizes(), self.strides()))
            if all(None not in size and None not in stride for _, size, stride in expected):
                self.exact = tuple((spec.dtype, torch.Size(size), tuple(stride)) for spec, size, stride in expected)

    def check(self, inputs: Sequence[torch.Tensor], sizes: list[int]) -> None:
        if self.exact is not None and all(
                isinstance(t, torch.Tensor) and t.dtype == dtype and t.is_cpu and t.shape == size
                and t.stride() == stride for t, (dtype, size, stride) in zip(inputs, self.exact)):
            return
        name = self.kernel.name
        for tensor, spec in zip(inputs, self.kernel.inputs):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or tensor.dtype != spec.dtype:
                got = f"{tensor.dtype} on {tensor.device}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise TypeError(f"{name}: input {spec.name} must be a CPU {spec.dtype} tensor, got {got}")
            if tensor.dim() != len(spec.size):
                raise ValueError(f"{name}: input {spec.name} has {tensor.dim()} dims, "
                                 f"but the kernel was generated for {len(spec.size)} ({spec})")
        values = sizes + [inputs[pos].shape[dim] if kind == "size" else inputs[pos].stride(dim)
                          for pos, dim, kind in self.extra]
        for tensor, spec, want_sizes, want_strides in zip(inputs, self.kernel.inputs, self.sizes(*values),
                                                          self.strides(*values)):
            sizes_differ = any(w is not None and w != n for w, n in zip(want_sizes, tensor.shape))
            strides_differ = tensor.numel() > 1 and any(
                w is not None and w != st for w, st, n in zip(want_strides, tensor.stride(), tensor.shape) if n > 1)
            if sizes_differ or strides_differ:
                what = " and ".join(w for w, bad in (("sizes", sizes_differ), ("strides", strides_differ)) if bad)
                raise ValueError(
                    f"{name}: input {spec.name} has {what} that differ from the ones the kernel was generated "
                    f"for: sizes {tuple(tensor.shape)}, strides {tensor.stride()}; expected sizes "
                    f"{_show(want_sizes)}, strides {_show(want_strides)} ('?': any). Pass a tensor with that "
                    "layout (e.g. .contiguous()) or compile again for this one")


def _show(values: Sequence[Any]) -> str:
    """Like a tuple's repr, with '?' for values the kernel does not constrain."""
    items = ["?" if v is None else str(v) for v in values]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


class CompiledKernel:
    """`kernel(*inputs, *symbol_values) -> tuple(outputs)`, running generated C++."""

    def __init__(self, kernel: Kernel, library: ctypes.CDLL, check_inputs: bool,
                 checks: Sequence[CheckSite] = (), fill: bool = False) -> None:
        self.__name__ = kernel.name
        self.fill = fill  # CppOptions.fill_uninitialized
        self.kernel = kernel
        self.checks = tuple(checks)  # run-time checks: the function then takes an int32_t* status
        self._function = getattr(library, kernel.name)
        n_ptrs = len(kernel.inputs) + len(kernel.outputs)
        status = [ctypes.POINTER(ctypes.c_int32)] if self.checks else []
        self._function.argtypes = [ctypes.c_void_p] * n_ptrs + [ctypes.c_int64] * len(kernel.symbols) + status
        self._function.restype = None
        # each output's sizes, then each one's strides (eager's layout, as loopir planned it)
        self._output_layouts = SizeFunction(kernel.symbols, [o.size for o in kernel.outputs]
                                            + [o.stride for o in kernel.outputs])
        self._layouts = _InputLayouts(kernel) if check_inputs else None
        self._scatter_bases = scatter_bases(kernel)

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        n_in = len(self.kernel.inputs)
        if len(args) != n_in + len(self.kernel.symbols):
            raise TypeError(f"{self.__name__} takes {n_in} tensors and {len(self.kernel.symbols)} sizes, "
                            f"got {len(args)} arguments")
        inputs, sizes = args[:n_in], [int(s) for s in args[n_in:]]
        if self._layouts is not None:
            self._layouts.check(inputs, sizes)
        layouts = self._output_layouts(*sizes)
        n_out = len(self.kernel.outputs)
        outputs = tuple(torch.empty_strided(size, stride, dtype=spec.dtype, device="cpu")
                        for size, stride, spec in zip(layouts[:n_out], layouts[n_out:], self.kernel.outputs))
        if fill_requested(self.fill):
            fill_uninitialized(outputs)
        for out_pos, in_pos in self._scatter_bases:  # a scatter's buffer starts as a copy of its base
            outputs[out_pos].copy_(inputs[in_pos])
        pointers = [t.data_ptr() for t in inputs] + [t.data_ptr() for t in outputs]
        if not self.checks:
            self._function(*pointers, *sizes)
            return outputs
        status = ctypes.c_int32(0)
        self._function(*pointers, *sizes, ctypes.byref(status))
        if status.value:
            raise_failed_check(self.__name__, self.kernel.symbols, self.checks, status.value, sizes)
        return outputs

    def __repr__(self) -> str:
        return f"<compiled C++ {self.__name__}>"
