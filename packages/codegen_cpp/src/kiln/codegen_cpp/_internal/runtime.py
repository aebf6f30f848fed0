"""Calling compiled kernels: check inputs, allocate outputs, pass pointers and sizes through ctypes.

A `CompiledKernel` pickles (for whole-graph caches such as kiln.integration's): it keeps what a
call needs of its loopir `Kernel` as a `KernelSignature` (the loop bodies, which hold closures,
are not needed to run it) and the path of its shared library, which unpickling re-opens only
after checking it against its recorded size and checksum (`ArtifactCache.verified`) in a
directory private to this user; a library that is gone or damaged raises `LibraryUnavailable`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import pathlib
import threading
from collections.abc import Sequence
from typing import Any

import sympy
import torch

from kiln.loopir import BufferSpec, Kernel, fill_requested, fill_uninitialized
from kiln.loopir.codegen import (
    ArtifactCache,
    ArtifactCacheError,
    CheckSite,
    LayoutGuard,
    SizeFunction,
    input_stores,
    layout_guard,
    raise_failed_check,
    scatter_bases,
)

from .output_pool import EMPTY_STRIDED_CPU, MIN_BYTES, POOL, byte_size

_PROFILING = torch._C._autograd._profiler_enabled  # a C call, about 50 ns


class LibraryUnavailable(RuntimeError):
    """A pickled kernel's shared library is missing, damaged or in an unsafe directory."""


@dataclasses.dataclass(frozen=True, slots=True)
class KernelSignature:
    """What calling a compiled kernel needs of its loopir `Kernel`: its name, the buffers it reads
    and writes, its size symbols, which input each scatter output starts as a copy of and which
    input's memory each stored-input output is (`kiln.loopir.codegen.input_stores`)."""

    name: str
    inputs: tuple[BufferSpec, ...]
    outputs: tuple[BufferSpec, ...]
    symbols: tuple[sympy.Symbol, ...]
    scatter_bases: tuple[tuple[int, int], ...]
    input_stores: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def of(kernel: Kernel | KernelSignature) -> KernelSignature:
        if isinstance(kernel, KernelSignature):
            return kernel
        return KernelSignature(kernel.name, tuple(kernel.inputs), tuple(kernel.outputs), tuple(kernel.symbols),
                               scatter_bases(kernel), input_stores(kernel))


_opened: dict[str, ctypes.CDLL] = {}  # libraries re-opened by unpickling, verified once per process
_opening = threading.Lock()


def _reopen_library(path: str) -> ctypes.CDLL:
    with _opening:
        if path not in _opened:
            library = pathlib.Path(path)
            cache = ArtifactCache(library.parent)
            try:
                cache.ensure_directory(library.parent)
            except (OSError, ArtifactCacheError) as exc:
                raise LibraryUnavailable(f"{library}: {exc}") from exc
            if not library.exists() or not cache.verified(library):
                raise LibraryUnavailable(f"compiled kernel library {library} is missing or does not match its "
                                         "recorded size and checksum")
            _opened[path] = ctypes.CDLL(path)
        return _opened[path]


def _unpickle_kernel(signature: KernelSignature, library_path: str, check_inputs: bool,
                     checks: tuple[CheckSite, ...], fill: bool) -> CompiledKernel:
    return CompiledKernel(signature, _reopen_library(library_path), check_inputs, checks, fill)


class _InputLayouts:
    """Expected sizes and strides of a kernel's inputs at given symbol values.

    An input may have a size symbol the kernel body never uses (e.g. the dimension a `select`
    removed); such a symbol is bound from the first input dimension it names, so every input
    that mentions it is checked against the same value.
    """

    def __init__(self, kernel: Kernel | KernelSignature) -> None:
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
    """`kernel(*inputs, *symbol_values) -> tuple(outputs)`, running generated C++.

    `kernel` is the loopir `Kernel` it was generated from, or only its `KernelSignature` once
    unpickled (see the module docstring)."""

    def __init__(self, kernel: Kernel | KernelSignature, library: ctypes.CDLL, check_inputs: bool,
                 checks: Sequence[CheckSite] = (), fill: bool = False) -> None:
        self.__name__ = kernel.name
        self.fill = fill  # CppOptions.fill_uninitialized
        self.kernel = kernel
        self.checks = tuple(checks)  # run-time checks: the function then takes an int32_t* status
        self._library_path = library._name
        self._check_inputs = check_inputs
        self._function = getattr(library, kernel.name)
        n_ptrs = len(kernel.inputs) + len(kernel.outputs)
        status = [ctypes.POINTER(ctypes.c_int32)] if self.checks else []
        self._function.argtypes = [ctypes.c_void_p] * n_ptrs + [ctypes.c_int64] * len(kernel.symbols) + status
        self._function.restype = None
        # each output's sizes, then each one's strides (eager's layout, as loopir planned it)
        self._output_layouts = SizeFunction(kernel.symbols, [o.size for o in kernel.outputs]
                                            + [o.stride for o in kernel.outputs])
        self._layouts = _InputLayouts(kernel) if check_inputs else None
        # outputs written into inputs: output position -> that input's position
        self._stored_outputs = dict(KernelSignature.of(kernel).input_stores)
        # scatter (output, base) copies made before each call: none where the output is the
        # base itself (a scatter into its dead base, passed as that output: `_new_outputs`)
        self._scatter_bases = tuple((out, base) for out, base in KernelSignature.of(kernel).scatter_bases
                                    if self._stored_outputs.get(out) != base)
        # A kernel without size symbols has one layout per output and (checked) one per input:
        # `_static_call` runs it from those alone (with its run-time checks' status and its
        # scatter bases' copies, if it has them).
        self._static: tuple[tuple[Any, ...], tuple[Any, ...] | None] | None = None
        self._guard: LayoutGuard | bool | None = None  # `_static_call`'s input check in one C++ call
        if not kernel.symbols:
            layouts, n_out = self._output_layouts(), len(kernel.outputs)
            # each output's allocator, chosen once: large ones from the pool (output_pool.py)
            allocations = tuple((tuple(size), tuple(stride), spec.dtype,
                                 POOL.allocate if byte_size(size, stride, spec.dtype.itemsize) >= MIN_BYTES
                                 else EMPTY_STRIDED_CPU)
                                for size, stride, spec in zip(layouts[:n_out], layouts[n_out:], kernel.outputs))
            exact = self._layouts.exact if self._layouts is not None else None
            if self._layouts is None or exact is not None:
                self._static = (allocations, exact)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unpickle_kernel, (KernelSignature.of(self.kernel), self._library_path, self._check_inputs,
                                   self.checks, self.fill))

    def __call__(self, *args: Any) -> tuple[torch.Tensor, ...]:
        if _PROFILING():  # under torch.profiler each kernel is a named range (kiln::kernel3) in its tables
            with torch.profiler.record_function(f"kiln::{self.__name__}"):
                outputs = self._static_call(args) if self._static is not None else None
                return outputs if outputs is not None else self._general_call(args)
        # (the static path inline: no frame more than `_static_call` per kernel call)
        outputs = self._static_call(args) if self._static is not None else None
        return outputs if outputs is not None else self._general_call(args)

    def _general_call(self, args: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:
        n_in = len(self.kernel.inputs)
        if len(args) != n_in + len(self.kernel.symbols):
            raise TypeError(f"{self.__name__} takes {n_in} tensors and {len(self.kernel.symbols)} sizes, "
                            f"got {len(args)} arguments")
        inputs, sizes = args[:n_in], [int(s) for s in args[n_in:]]
        if self._layouts is not None:
            self._layouts.check(inputs, sizes)
        layouts = self._output_layouts(*sizes)
        n_out = len(self.kernel.outputs)
        outputs = self._new_outputs(inputs, [(size, stride, spec.dtype, POOL.allocate) for size, stride, spec
                                             in zip(layouts[:n_out], layouts[n_out:], self.kernel.outputs)])
        if fill_requested(self.fill):  # not the stored inputs: the kernel reads their old values
            fill_uninitialized(out for pos, out in enumerate(outputs) if pos not in self._stored_outputs)
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

    def _static_call(self, inputs: tuple[Any, ...]) -> tuple[torch.Tensor, ...] | None:
        """Run a static kernel (see `_static`) on inputs of exactly its inputs' layouts; None for
        anything else (another layout, a stray argument, outputs to fill), which the general
        path handles and names in its errors."""
        allocations, exact = self._static
        if len(inputs) != len(self.kernel.inputs):
            return None
        guard = self._guard  # one C++ check of every input (layout_guard); the loop below decides on a no
        if exact is not None and not (guard and guard(*inputs)):
            try:
                for tensor, (dtype, size, stride) in zip(inputs, exact):
                    if tensor.dtype is not dtype or not tensor.is_cpu or tensor.shape != size or tensor.stride() != stride:
                        return None
            except AttributeError:  # not a tensor
                return None
            if guard is None:  # built once, from the first inputs that pass (False: none to be had)
                self._guard = layout_guard(inputs) or False
        if fill_requested(self.fill):
            return None  # the general path fills
        if self._stored_outputs:
            outputs = self._new_outputs(inputs, allocations)
        else:  # the common case, without a frame more
            outputs = tuple([allocate(size, stride, dtype) for size, stride, dtype, allocate in allocations])
        for out_pos, in_pos in self._scatter_bases:  # a scatter's buffer starts as a copy of its base
            outputs[out_pos].copy_(inputs[in_pos])
        if not self.checks:
            self._function(*[t.data_ptr() for t in inputs], *[t.data_ptr() for t in outputs])
            return outputs
        status = ctypes.c_int32(0)
        self._function(*[t.data_ptr() for t in inputs], *[t.data_ptr() for t in outputs], ctypes.byref(status))
        if status.value:
            raise_failed_check(self.__name__, self.kernel.symbols, self.checks, status.value, [])
        return outputs

    def _new_outputs(self, inputs: Sequence[torch.Tensor], allocations: Sequence[tuple[Any, Any, torch.dtype, Any]]
                     ) -> tuple[torch.Tensor, ...]:
        """Each output: `allocate(size, stride, dtype)`, or, for an output the kernel stores into
        an input (`input_stores`), that input's tensor, whose memory the kernel then writes (its
        layout is the output's: checked before), with nothing allocated for it."""
        stored = self._stored_outputs
        return tuple([inputs[stored[pos]] if pos in stored else allocate(size, stride, dtype)
                      for pos, (size, stride, dtype, allocate) in enumerate(allocations)])

    def __repr__(self) -> str:
        return f"<compiled C++ {self.__name__}>"
