"""`CppOptions`: every knob of the C++ codegen, one frozen validated dataclass."""

from __future__ import annotations

import dataclasses
import os
import pathlib

from kiln.loopir.codegen import default_cache_root

# The default of `CppOptions.vectorize` when KILN_CPP_VECTORIZE is unset or empty.
VECTORIZE_DEFAULT = True


class CppCodegenError(NotImplementedError):
    """codegen_cpp cannot generate C++ for a kernel (a dtype it has no type for, a body that
    breaks what the scheduler promises); the message names the kernel and buffer."""


def default_vectorize() -> bool:
    """`CppOptions.vectorize` when not given: KILN_CPP_VECTORIZE=1 or 0 when set (how a
    benchmark compares both paths through the backend), else VECTORIZE_DEFAULT."""
    value = os.environ.get("KILN_CPP_VECTORIZE", "").strip().lower()
    if not value:
        return VECTORIZE_DEFAULT
    if value not in ("0", "1", "true", "false", "on", "off"):
        raise ValueError(f"KILN_CPP_VECTORIZE must be 1 or 0, got {value!r}")
    return value in ("1", "true", "on")


def default_cache_dir() -> pathlib.Path:
    """Per user: ``$XDG_CACHE_HOME/kiln/codegen_cpp`` or ``~/.cache/kiln/codegen_cpp`` (loopir's
    `default_cache_root`), never a fixed path in the shared temp directory."""
    return default_cache_root() / "codegen_cpp"


@dataclasses.dataclass(frozen=True, slots=True)
class CppOptions:
    """Options of `compile`.

    cache_dir: where sources and shared libraries are kept, keyed by content hash.
    compiler / flags: the C++ compiler and its flags (part of the cache key).
    openmp: parallelize outer loops with OpenMP (without it, only `omp simd` hints are kept).
    parallel_threshold: loop nests doing fewer iterations than this run on one thread.
    check_strides: on every call, check each kernel input's dtype, device, sizes and strides
      against the ones the kernel was generated for (ValueError/TypeError instead of a wrong
      result or an out-of-bounds read); turn off only when the caller guarantees them.
    vectorize: write the innermost loop of pointwise kernels, row loops and reductions as
      explicit vector code (kiln's SIMD layer and vector math, README "Vector code"); off,
      every loop is scalar C++ marked `omp simd` for GCC's auto-vectorizer. Its default is
      VECTORIZE_DEFAULT, or the environment's KILN_CPP_VECTORIZE (1 or 0) when set.
    vector_math: let scalar loops that GCC vectorizes call glibc's vector math library (libmvec: exp, log,
      tanh, erf, ... at most 4 ulp from the correctly rounded result); when the library is
      missing, `compile` rebuilds without it.
    fill_uninitialized: fill every output with NaN (integers: their largest value) before the
      kernel writes it, so an element a kernel fails to write shows (a debug mode; also on
      under torch's deterministic mode with `fill_uninitialized_memory`, as for torch.empty).
    """

    cache_dir: pathlib.Path = dataclasses.field(default_factory=default_cache_dir)
    compiler: str = "g++"
    # -fwrapv: signed integer overflow wraps, as in eager, instead of being undefined behaviour.
    # -fno-trapping-math: GCC may if-convert float compares in scalar loops (no FP exceptions are
    # observed), so a relu does not keep a loop from vectorizing.
    # -ffp-contract=off: each multiply and add rounds as eager's do; GCC's default (fast) fuses
    # `a * b - c` into one fma, so `x - mean(x)` over a row of one element was not 0 (the
    # fuzzer's layer_norm(rms_norm(x)) on 8x1). kiln's vector math calls fma explicitly.
    flags: tuple[str, ...] = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fwrapv",
                              "-ffp-contract=off", "-std=c++17")
    openmp: bool = True
    parallel_threshold: int = 32768
    check_strides: bool = True
    vectorize: bool = dataclasses.field(default_factory=default_vectorize)
    vector_math: bool = True
    fill_uninitialized: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_dir", pathlib.Path(self.cache_dir))
        if self.parallel_threshold < 0:
            raise ValueError(f"parallel_threshold must be >= 0, got {self.parallel_threshold}")
        if not isinstance(self.flags, tuple):
            raise TypeError(f"flags must be a tuple of strings, got {type(self.flags).__name__}")
