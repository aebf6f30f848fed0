"""`StaticLaunch`: launch a compiled Triton kernel through torch's C++ launcher.

Triton's own launcher (`CompiledKernel.run`) parses every argument in Python-facing C code and
runs its launch hooks: about 10 us of host time per launch on an H200's host, more than many
small kernels take on the GPU. CUDA builds of torch carry a launcher in C++
(`torch._C._StaticCudaLauncher`: load a cubin, launch it with arguments typed by a short type
string) that costs a few microseconds. This module feeds it a kernel Triton compiled: the
cubin bytes, the kernel's name, shared memory, warps, and the type letter of each argument
Triton kept in the compiled signature (constexprs and ints Triton specialized to a constant
are not passed).

Everything here is optional: `StaticLaunch.of(compiled, device)` returns None when torch has
no such launcher (CPU builds, ROCm), when the kernel needs something it does not handle
(launch hooks, several CTAs, scratch memory, an argument type without a letter), or when
loading fails; the caller then keeps Triton's launcher.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

ALIGNMENT = 16  # bytes: Triton specializes pointers on `data_ptr() % 16 == 0`

# The launcher's letter for each scalar type of a Triton signature; pointers are "O" (a tensor,
# or None for a null pointer).
_TYPE_LETTERS = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H",
                 "u32": "I", "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "f32": "f", "fp64": "d"}


def _launcher_impl() -> Any:
    if torch.version.hip is not None:  # the HIP ABI passes scratch arguments differently
        return None
    return getattr(torch._C, "_StaticCudaLauncher", None)


def argument_plan(signature: dict[Any, str], arg_names: Sequence[str], constants: Any = ()) -> tuple[str, tuple[int, ...]]:
    """(type letters, positions kept): which of the kernel's arguments, in parameter order,
    reach the compiled function, and each one's letter. Raises KeyError for a type without
    a letter."""
    def position(key: Any) -> int:
        if isinstance(key, str):
            return list(arg_names).index(key)
        return key[0] if isinstance(key, tuple) else key
    types = {position(key): ty for key, ty in signature.items()}
    constant_positions = {position(key) for key in constants}
    letters, kept = [], []
    for i in sorted(types):
        ty = types[i]
        if ty == "constexpr" or i in constant_positions:
            continue
        letters.append("O" if ty.startswith("*") else _TYPE_LETTERS[ty])
        kept.append(i)
    return "".join(letters), tuple(kept)


class StaticLaunch:
    """One compiled kernel, loaded for one device; `launch` runs it."""

    def __init__(self, impl: Any, function: Any, module: Any, num_warps: int, shared: int, letters: str,
                 kept: tuple[int, ...], trailing_nulls: int) -> None:
        self.impl = impl
        self.function = function
        self._module = module  # keeps the loaded module alive where the launcher returns one
        self.num_warps = num_warps
        self.shared = shared
        self.letters = letters + "O" * trailing_nulls
        self._kept = kept
        # Usually the kept arguments are the first ones (the block-size constexprs come last):
        # then a slice picks them, cheaper than an index per argument (and fast_launch.py can
        # pass them without slicing).
        self.kept_prefix = len(kept) if kept == tuple(range(len(kept))) else None
        self.nulls = (None,) * trailing_nulls  # the scratch pointers, after the kept arguments
        self.proven = False  # a launch went through (a refused argument shows on the first)

    @classmethod
    def of(cls, compiled: Any, device: int) -> StaticLaunch | None:
        impl = _launcher_impl()
        if impl is None:
            return None
        try:
            return cls._load(impl, compiled, device)
        except Exception as error:  # any surprise: Triton's own launcher stays in charge
            log.info("codegen_triton: no static launch for %s (%s)", getattr(compiled, "name", "?"), error)
            return None

    @classmethod
    def _load(cls, impl: Any, compiled: Any, device: int) -> StaticLaunch | None:
        metadata = compiled.metadata
        if getattr(metadata, "num_ctas", 1) != 1 or "cubin" not in compiled.asm:
            return None
        # Triton >= 3.4 compiles scratch-pointer parameters into every kernel: null when the
        # kernel uses no scratch memory, which is all this launcher supports.
        trailing_nulls = 0
        for field in ("global_scratch_size", "profile_scratch_size"):
            if hasattr(metadata, field):
                if getattr(metadata, field):
                    return None
                trailing_nulls += 1
        source = compiled.src
        letters, kept = argument_plan(source.signature, source.fn.arg_names, getattr(source, "constants", {}))
        with tempfile.TemporaryDirectory(prefix="kiln-cubin-") as directory:
            path = os.path.join(directory, "kernel.cubin")
            with open(path, "wb") as f:
                f.write(compiled.asm["cubin"])
            loaded = impl._load_kernel(path, metadata.name, metadata.shared, device)
        # torch 2.11 returns (function, registers, spills); later ones (module, function, ...)
        function, module = (loaded[1], loaded[0]) if len(loaded) == 4 else (loaded[0], None)
        return cls(impl, function, module, metadata.num_warps, metadata.shared, letters, kept, trailing_nulls)

    def launch(self, grid_x: int, stream: int, args: Sequence[Any]) -> None:
        """`args`: every argument of the kernel in parameter order, constexprs included."""
        if self.kept_prefix is not None:
            passed = args[:self.kept_prefix] + self.nulls
        else:
            passed = tuple(args[i] for i in self._kept) + self.nulls
        self.impl._launch_kernel(self.function, grid_x, 1, 1, self.num_warps, self.shared,
                                 self.letters, passed, stream)
