"""`KilnOptions`: the backend's one frozen, validated options record.

Environment variables are read here and nowhere else in kiln:
  KILN_DEBUG=<dir>      dump every stage's graph and the generated source under <dir>
  KILN_CACHE_DIR=<dir>  where generated code, shared libraries and whole compiled graphs are cached
  KILN_GRAPH_CACHE=0    do not load or store whole compiled graphs (the generated-code cache stays)
  KILN_VERIFY_CALLS=<n> compare each compiled region with eager on its first n calls
  KILN_FILL_UNINITIALIZED=1  fill every buffer kiln allocates with NaN before kernels write it
  KILN_SYNC_CHECKS=1    GPU kernels' run-time checks raise eager's exception at once (also set by
                        CUDA_LAUNCH_BLOCKING=1)
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from kiln import loopir

from . import codegen_registry


class OptionsError(ValueError):
    """Unknown or invalid backend option."""


@dataclasses.dataclass(frozen=True, slots=True)
class KilnOptions:
    """Options of the kiln backend (pass as `torch.compile(..., options={...})`).

    debug_dir: write each stage's graph and generated code here (KILN_DEBUG).
    cache_dir: generated code cache (KILN_CACHE_DIR); None: the codegen's default.
    min_region_size: regions with fewer ATen ops than this stay as eager ATen calls.
    fallback: when a graph or region cannot be compiled, run it eagerly (True) or raise (False).
    verify: run every stage's `verify()` between stages (always on when debug_dir is set).
    openmp / parallel_threshold: C++ codegen parallelism (parallel_threshold None: the codegen's
        default, which for C++ depends on OMP_WAIT_POLICY: codegen_cpp's `default_parallel_threshold`).
    codegen: None picks the codegen by the inputs' device ("cpu": C++, "cuda": Triton); a name
        forces one (e.g. "cuda" on CPU tensors runs Triton's interpreter, TRITON_INTERPRET=1;
        "reference" runs kernels on loopir's reference evaluator), any `kiln.codegen` entry point.
    partitioner: how training graphs split into forward and backward: "min_cut" (recompute cheap
        ops in the backward to save activation memory) or "save_all".
    bias_epilogues: linear layers' `addmm(bias, x, w)` become `mm(x, w)` plus a bias add fused
        into the next kernel (True) or stay one addmm (False); None: the codegen's default
        (its `Capabilities.bias_epilogues`).
    verify_calls: on each compiled region's first `verify_calls` calls, also run the region's
        ATen ops eagerly and compare; a difference raises `RegionMismatchError` naming the first
        kernel whose outputs differ from loopir's reference evaluator (a debug mode: slow).
    fill_uninitialized: every kernel output is filled with NaN (integers: their largest value)
        before the kernel writes it, so elements a kernel fails to write show (a debug mode).
    lowerings: loopir's lowering table (a `kiln.loopir.Lowerings`; None: the default), e.g.
        ``default_lowerings() | my_table`` for custom ops: the partitioner sends exactly the
        ops it lowers to loopir.
    round_low_precision: round every bfloat16/float16 op result as eager does (True), instead
        of computing in float32 and rounding once on store (False, Inductor's semantics).
    sync_checks: on a GPU, wait after each kernel with run-time checks (an index out of range)
        and raise eager's exception naming the kernel (True), or let a failed check become a
        device-side assert reported at the next synchronization, as eager's CUDA indexing errors
        are (False: the host never waits; KILN_SYNC_CHECKS=1 or CUDA_LAUNCH_BLOCKING=1 sets it).
    autotune: codegens that can time kernels (Triton) pick each kernel's block sizes by timing a
        few configurations on its first launch instead of by heuristics; mode="max-autotune"
        and "max-autotune-no-cudagraphs" set it.
    graph_cache: load compiled graphs from, and store them in, the whole-graph cache on disk
        (under cache_dir; KILN_GRAPH_CACHE=0 turns it off), so a later process skips tracing,
        lowering and code generation. Graphs compiled with debug_dir, verify or verify_calls
        are neither loaded nor stored.
    graph_cache_max_bytes: the whole-graph cache's bound; least recently used entries go first.
    """

    debug_dir: pathlib.Path | None = None
    cache_dir: pathlib.Path | None = None
    min_region_size: int = 1
    fallback: bool = True
    verify: bool = False
    openmp: bool = True
    parallel_threshold: int | None = None
    codegen: str | None = None
    partitioner: str = "min_cut"
    bias_epilogues: bool | None = None
    verify_calls: int = 0
    fill_uninitialized: bool = False
    lowerings: Any = None
    round_low_precision: bool = False
    sync_checks: bool = False
    autotune: bool = False
    graph_cache: bool = True
    graph_cache_max_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        for name, kinds in _TYPES.items():
            value = getattr(self, name)
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                wanted = " or ".join("None" if k is type(None) else k.__name__ for k in kinds)
                raise OptionsError(f"kiln option {name} must be {wanted}, got {value!r} ({type(value).__name__})")
        for name in ("debug_dir", "cache_dir"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, pathlib.Path(value))
        if self.min_region_size < 1:
            raise OptionsError(f"min_region_size must be >= 1, got {self.min_region_size}")
        if self.parallel_threshold is not None and self.parallel_threshold < 0:
            raise OptionsError(f"parallel_threshold must be >= 0, got {self.parallel_threshold}")
        if self.verify_calls < 0:
            raise OptionsError(f"verify_calls must be >= 0, got {self.verify_calls}")
        if self.graph_cache_max_bytes < 0:
            raise OptionsError(f"graph_cache_max_bytes must be >= 0, got {self.graph_cache_max_bytes}")
        if self.partitioner not in ("min_cut", "save_all"):
            raise OptionsError(f"partitioner must be 'min_cut' or 'save_all', got {self.partitioner!r}")
        if self.lowerings is not None and not isinstance(self.lowerings, loopir.Lowerings):
            raise OptionsError(f"kiln option lowerings must be None or a kiln.loopir.Lowerings (e.g. "
                               f"default_lowerings() | my_table), got a {type(self.lowerings).__name__}")
        if self.codegen is not None:
            names = codegen_registry.registered()
            if self.codegen not in names:  # loads that codegen only (listing them loads them all)
                raise OptionsError(f"kiln option codegen={self.codegen!r} names no codegen; registered under "
                                   f"{codegen_registry.ENTRY_POINT_GROUP!r}: {', '.join(sorted(names))}")

    @classmethod
    def create(cls, overrides: Mapping[str, Any] | KilnOptions | None = None,
               environ: Mapping[str, str] | None = None) -> KilnOptions:
        """Options from the environment, then `overrides` (unknown keys raise OptionsError)."""
        if isinstance(overrides, KilnOptions):
            return overrides
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if environ.get("KILN_DEBUG"):
            values["debug_dir"] = environ["KILN_DEBUG"]
        if environ.get("KILN_CACHE_DIR"):
            values["cache_dir"] = environ["KILN_CACHE_DIR"]
        if environ.get("KILN_VERIFY_CALLS"):
            values["verify_calls"] = _int_variable(environ, "KILN_VERIFY_CALLS")
        if environ.get("KILN_FILL_UNINITIALIZED"):
            values["fill_uninitialized"] = _int_variable(environ, "KILN_FILL_UNINITIALIZED") != 0
        if environ.get("KILN_GRAPH_CACHE"):
            values["graph_cache"] = _int_variable(environ, "KILN_GRAPH_CACHE") != 0
        if environ.get("KILN_SYNC_CHECKS") or environ.get("CUDA_LAUNCH_BLOCKING") == "1":
            values["sync_checks"] = _int_variable(environ, "KILN_SYNC_CHECKS") != 0 \
                if environ.get("KILN_SYNC_CHECKS") else True
        valid = [f.name for f in dataclasses.fields(cls)]
        for key, value in dict(overrides or {}).items():
            if key not in valid:
                raise OptionsError(f"unknown kiln option {key!r}; valid options: {', '.join(valid)}")
            values[key] = value
        return cls(**values)

    def codegen_settings(self) -> dict[str, Any]:
        """Every option by name: what a codegen's `make_options` reads its own from."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


_PATH = (str, os.PathLike, type(None))
_TYPES: dict[str, tuple[type, ...]] = {
    "debug_dir": _PATH, "cache_dir": _PATH, "min_region_size": (int,), "fallback": (bool,), "verify": (bool,),
    "openmp": (bool,), "parallel_threshold": (int, type(None)), "codegen": (str, type(None)), "partitioner": (str,),
    "bias_epilogues": (bool, type(None)), "verify_calls": (int,), "fill_uninitialized": (bool,),
    "round_low_precision": (bool,), "sync_checks": (bool,), "autotune": (bool,), "graph_cache": (bool,),
    "graph_cache_max_bytes": (int,),
}


def _int_variable(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise OptionsError(f"{name} must be an integer, got {environ[name]!r}") from None
