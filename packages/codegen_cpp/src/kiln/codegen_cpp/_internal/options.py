"""`CppOptions`: every knob of the C++ codegen, one frozen validated dataclass."""

from __future__ import annotations

import dataclasses
import numbers
import os
import pathlib

from kiln.loopir.codegen import ARITHMETIC_OPS, check_option_types, default_cache_root

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


# Loop nests below these many iterations run on one thread. Measured on a 2-core VM (torch 2.13,
# its libgomp): under OMP_WAIT_POLICY=passive, OpenMP's threads sleep as soon as a parallel region
# ends and waking them costs 70-100 us per region, so an add over 524288 floats took 53 us on one
# thread and 102 us on two (sigmoid: 221 vs 190 us; 65536 floats: 10 vs 111 us); with active
# waiting (libgomp's default: spin, then sleep) a region costs a few us and two threads win
# from about 65536 floats.
PARALLEL_THRESHOLD = 32768
PASSIVE_PARALLEL_THRESHOLD = 262144


# Kernels of plain arithmetic (`LIGHT_OPS`: loads, compares, selects, adds, products; no exp, log,
# division, ...) move memory more than they compute: a second thread pays off only for this many
# times more iterations. Measured on the 2-core VM under OMP_WAIT_POLICY=passive (BENCHMARKS.md
# session 16: the same kernel compiled for one thread and for two, timed in turns): a ReLU backward,
# an add and a ReLU-backward column sum over 131072 to 2097152 float32 points ran faster on one
# thread up to 524288 (e.g. 154.7 vs 203.5 us), even at 1048576 (249 vs 228, 225 vs 270, 192 vs
# 192 us) and slower from 2097152; bfloat16 the same. With active waiting two threads win for an
# add from about 65536 floats, twice PARALLEL_THRESHOLD.
PASSIVE_LIGHT_WORK_FACTOR = 4
LIGHT_WORK_FACTOR = 2
LIGHT_OPS = ARITHMETIC_OPS - {"truediv", "reciprocal"}  # a vector division is not cheap


def _waits_passively() -> bool:
    """OMP_WAIT_POLICY=passive (which libgomp reads when it loads)."""
    return os.environ.get("OMP_WAIT_POLICY", "").strip().lower() == "passive"


def light_parallel_threshold(options: CppOptions) -> int:
    """The `parallel_threshold` of a loop nest whose every op is in `LIGHT_OPS` (see above)."""
    return options.parallel_threshold * (PASSIVE_LIGHT_WORK_FACTOR if _waits_passively() else LIGHT_WORK_FACTOR)


def default_parallel_threshold() -> int:
    """`CppOptions.parallel_threshold` when not given: PASSIVE_PARALLEL_THRESHOLD when the process
    waits passively (OMP_WAIT_POLICY=passive, which libgomp reads when it loads), else
    PARALLEL_THRESHOLD."""
    return PASSIVE_PARALLEL_THRESHOLD if _waits_passively() else PARALLEL_THRESHOLD


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
    parallel_threshold: loop nests doing fewer iterations than this run on one thread; its
      default depends on the process's OpenMP wait policy (`default_parallel_threshold`). A
      kernel of plain arithmetic parallel over its outer points takes 2x this (4x under passive
      waiting: `light_parallel_threshold`).
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
    parallel_threshold: int = dataclasses.field(default_factory=default_parallel_threshold)
    check_strides: bool = True
    vectorize: bool = dataclasses.field(default_factory=default_vectorize)
    vector_math: bool = True
    fill_uninitialized: bool = False

    def __post_init__(self) -> None:
        """Every field checked when the options are built (not when a kernel first compares
        with one): a wrong type raises TypeError, a wrong value ValueError, each naming the
        option and what it accepts."""
        check_option_types(self, _TYPES)
        object.__setattr__(self, "parallel_threshold", int(self.parallel_threshold))
        if self.parallel_threshold < 0:
            raise ValueError(f"CppOptions.parallel_threshold must be an int >= 0 (0: every parallel path), "
                             f"got {self.parallel_threshold}")
        if not self.compiler.strip():
            raise ValueError("CppOptions.compiler must name a C++ compiler (e.g. 'g++', 'clang++'), got ''")
        bad_flags = [flag for flag in self.flags if not isinstance(flag, str) or not flag.strip()]
        if bad_flags:
            raise TypeError(f"CppOptions.flags must be a tuple of non-empty strings (compiler flags), "
                            f"got {bad_flags[0]!r} in {self.flags!r}")


# option -> (accepted types, what the error says it accepts); bool is refused where int is
# wanted (True is an int to isinstance).
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "cache_dir": ((str, os.PathLike), "a path (str or os.PathLike)"),
    "compiler": ((str,), "a str (the C++ compiler's command, e.g. 'g++')"),
    "flags": ((tuple,), "a tuple of strings (compiler flags)"),
    "openmp": ((bool,), "a bool"),
    "parallel_threshold": ((numbers.Integral,), "an int >= 0 (loop iterations)"),
    "check_strides": ((bool,), "a bool"),
    "vectorize": ((bool,), "a bool"),
    "vector_math": ((bool,), "a bool"),
    "fill_uninitialized": ((bool,), "a bool"),
}
