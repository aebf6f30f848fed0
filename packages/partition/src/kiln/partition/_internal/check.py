"""`check_replacement`: run a pattern and its replacement on random inputs and compare."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from .pattern import Pattern

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ReplacementCheck:
    """The outcome of `check_replacement`; truthy when every trial agreed."""

    ok: bool
    trials: int
    max_abs_error: float
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.message


def check_replacement(
    pattern: Pattern | Callable[..., Any] | fx.Graph,
    replacement: Callable[..., Any] | fx.Graph,
    example_inputs: Sequence[Any],
    *,
    trials: int = 3,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
) -> ReplacementCheck:
    """Run `pattern` and `replacement` on `example_inputs`, then on `trials - 1` random inputs
    of the same shapes and dtypes, and compare every output (`torch.testing.assert_close`
    tolerances unless `rtol`/`atol` are given). Inputs are cloned for each side, so in-place
    patterns are compared too (outputs and the inputs they mutate).

    Returns a `ReplacementCheck`: `ok`, the largest absolute error seen, and a message naming
    the first mismatch (trial, output index, what differed).
    """
    run_pattern, run_replacement = _callable(pattern), _callable(replacement)
    generator = torch.Generator().manual_seed(seed)
    worst = 0.0
    for trial in range(max(1, trials)):
        inputs = list(example_inputs) if trial == 0 else _random_like(example_inputs, generator)
        left_in, right_in = _clone(inputs), _clone(inputs)
        try:
            want = pytree.tree_leaves((run_pattern(*left_in), left_in))
            got = pytree.tree_leaves((run_replacement(*right_in), right_in))
        except Exception as error:
            return ReplacementCheck(False, trial + 1, worst, f"trial {trial}: raised {error!r}")
        if len(want) != len(got):
            return ReplacementCheck(
                False, trial + 1, worst,
                f"trial {trial}: the pattern gives {len(want)} values, the replacement {len(got)}",
            )
        for position, (w, g) in enumerate(zip(want, got)):
            worst = max(worst, _abs_error(w, g))
            try:
                torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as error:
                message = f"trial {trial}, value {position}: {error}"
                logger.info("check_replacement mismatch: %s", message)
                return ReplacementCheck(False, trial + 1, worst, message)
    return ReplacementCheck(True, max(1, trials), worst, f"{max(1, trials)} trials agree")


def _callable(source: Any) -> Callable[..., Any]:
    if isinstance(source, Pattern):
        return source.module
    if isinstance(source, fx.Graph):
        root = source.owning_module if source.owning_module is not None else torch.nn.Module()
        return fx.GraphModule(root, source)
    if callable(source):
        return source
    raise TypeError(f"check_replacement: cannot run {type(source).__name__}")


def _clone(values: list[Any]) -> list[Any]:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def _random_like(values: Sequence[Any], generator: torch.Generator) -> list[Any]:
    return [_random_tensor(v, generator) if isinstance(v, torch.Tensor) else v for v in values]


def _random_tensor(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    if like.dtype == torch.bool:
        fresh = torch.rand(like.shape, generator=generator) < 0.5
    elif like.dtype.is_floating_point or like.dtype.is_complex:
        fresh = torch.randn(like.shape, generator=generator, dtype=like.dtype)
    else:  # integers: stay in the example's range (they are often indices)
        low = int(like.min()) if like.numel() else 0
        high = int(like.max()) + 1 if like.numel() else 1
        fresh = torch.randint(low, max(high, low + 1), like.shape, generator=generator)
        fresh = fresh.to(like.dtype)
    return fresh.to(like.device).requires_grad_(like.requires_grad)


def _abs_error(want: Any, got: Any) -> float:
    if not (isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor)):
        return 0.0
    if want.shape != got.shape or want.numel() == 0:
        return 0.0
    diff = (want.detach().double() - got.detach().double()).abs()
    finite = diff[torch.isfinite(diff)]
    return float(finite.max()) if finite.numel() else 0.0
