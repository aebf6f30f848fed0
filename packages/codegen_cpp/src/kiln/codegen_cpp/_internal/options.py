"""`CppOptions`: every knob of the C++ codegen, one frozen validated dataclass."""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile


class CppCodegenError(NotImplementedError):
    """codegen_cpp cannot generate C++ for a kernel (a dtype it has no type for, a body that
    breaks what the scheduler promises); the message names the kernel and buffer."""


def default_cache_dir() -> pathlib.Path:
    return pathlib.Path(tempfile.gettempdir()) / "kiln-cache" / "codegen_cpp"


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
    vectorize: write the innermost loop of pointwise kernels, row loops and sum/max/min
      reductions as explicit vector code (kiln's SIMD layer and vector math); off (the default
      for now: on AVX-512 hosts it measured 0.3-0.7x the speed of GCC's auto-vectorized loops
      with libmvec, see BENCHMARKS.md), every loop is scalar C++ marked `omp simd`.
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
    flags: tuple[str, ...] = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fwrapv",
                              "-std=c++17")
    openmp: bool = True
    parallel_threshold: int = 32768
    check_strides: bool = True
    vectorize: bool = False
    vector_math: bool = True
    fill_uninitialized: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_dir", pathlib.Path(self.cache_dir))
        if self.parallel_threshold < 0:
            raise ValueError(f"parallel_threshold must be >= 0, got {self.parallel_threshold}")
        if not isinstance(self.flags, tuple):
            raise TypeError(f"flags must be a tuple of strings, got {type(self.flags).__name__}")
