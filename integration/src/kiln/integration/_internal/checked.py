"""Verify mode (`KilnOptions.verify_calls`): compiled regions compared with eager as they run.

On each of its first calls a `CheckedRegion` runs the compiled region, then the region's ATen
ops eagerly on the same inputs, and compares every output. On a difference it replays the
compiled region kernel by kernel, comparing each kernel's outputs with loopir's reference
evaluator on the same inputs, and raises `RegionMismatchError` naming the region, the output,
and the first kernel that differs (with its loop bodies). This finds bugs that only a real
device shows (races, unwritten elements, wrong masks) in the kernel that holds them.

Under ``TORCHDYNAMO_REPRO_AFTER=aot`` (Dynamo's after-AOT minifier drives Inductor's compiler
only) the checked regions are kiln's after-AOT minifier: a region writes Dynamo's minifier
launcher for its ATen graph, with the real inputs of its first call, at
``TORCHDYNAMO_REPRO_LEVEL`` 2 when the compiled region raises, 3 always (the last region's
launcher stays), 4 when its outputs differ from eager's. The launcher minifies that graph with
``backend="kiln"`` (`python minifier_launcher.py`, Dynamo's after-dynamo minifier).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._dynamo.debug_utils import get_minifier_repro_path
from torch._dynamo.repro.after_dynamo import dump_to_minify_after_dynamo

from kiln.loopir import Kernel

log = logging.getLogger(__name__)

# Differences allowed, relative to the largest finite magnitude of the eager value: fused
# kernels sum in other orders than ATen's kernels.
RELATIVE_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}
MAX_KERNEL_TEXT = 3000  # characters of a kernel's loop bodies quoted in an error


class RegionMismatchError(RuntimeError):
    """A compiled region's output differs from eager (verify mode)."""


def difference(got: Any, want: Any) -> str | None:
    """Why `got` is not `want` within the tolerance of its dtype (None: it is)."""
    if not isinstance(want, torch.Tensor):
        return None if got == want else f"{got!r} where eager gives {want!r}"
    if not isinstance(got, torch.Tensor):
        return f"a {type(got).__name__} where eager gives a tensor"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)} where eager gives {want.dtype}{list(want.shape)}"
    got, want = got.detach().cpu(), want.detach().cpu()
    if not want.is_floating_point():
        bad = int((got != want).sum())
        return f"{bad} of {want.numel()} elements differ" if bad else None
    got64, want64 = got.double(), want.double()
    finite = torch.isfinite(want64)
    scale = float(want64[finite].abs().max()) if bool(finite.any()) else 0.0
    tolerance = RELATIVE_TOLERANCE.get(want.dtype, 1e-4) * scale + torch.finfo(want.dtype).tiny
    error = (got64 - want64).abs()
    same_special = (got64 == want64) | (got64.isnan() & want64.isnan())  # inf == inf, NaN where eager has NaN
    bad = ~same_special & ~(error <= tolerance)
    count = int(bad.sum())
    if not count:
        return None
    unwritten = int((got64.isnan() & ~want64.isnan()).sum())
    worst = float(error[bad & ~error.isnan()].max()) if bool((bad & ~error.isnan()).any()) else float("nan")
    text = (f"{count} of {want.numel()} elements differ (max abs error {worst:.3g} where eager's values "
            f"reach {scale:.3g}; tolerance {tolerance:.3g})")
    return text + (f", {unwritten} of them NaN where eager's are not" if unwritten else "")


def repro_after_aot_level() -> int:
    """``TORCHDYNAMO_REPRO_LEVEL`` when ``TORCHDYNAMO_REPRO_AFTER=aot``, else 0 (read when a
    region is compiled, as Dynamo reads its own config when it compiles a frame)."""
    config = torch._dynamo.config
    return int(config.repro_level) if config.repro_after == "aot" else 0


class CheckedRegion(torch.nn.Module):
    """A compiled region that checks itself against its ATen ops on its first `calls` calls
    (at after-AOT repro levels 2 and 3 it only writes the minifier launcher: see above)."""

    def __init__(self, name: str, compiled: torch.nn.Module, eager: fx.GraphModule,
                 kernels: Sequence[Kernel], calls: int, label: str = "") -> None:
        super().__init__()
        self.name = name
        self.label = label  # which graph: "", "forward ", "backward "
        self.compiled = compiled
        self.eager = eager
        self.kernels = {k.name: k for k in kernels}
        self.remaining = calls
        self.repro_level = repro_after_aot_level()

    def forward(self, *args: Any) -> Any:
        if self.remaining <= 0:
            return self.compiled(*args)
        self.remaining -= 1
        if self.repro_level in (2, 3):
            return self._run_writing_repro(args)
        got = self.compiled(*args)
        want = self.eager(*args)
        for position, (g, w) in enumerate(zip(pytree.tree_leaves(got), pytree.tree_leaves(want), strict=True)):
            problem = difference(g, w)
            if problem is not None:
                report = self._report(position, problem, args)
                if self.repro_level == 4:
                    report += f"\n{self._write_launcher(_cloned(args))}"
                raise RegionMismatchError(report)
        log.info("kiln verify: %sregion %s matches eager", self.label, self.name)
        return got

    def _run_writing_repro(self, args: Sequence[Any]) -> Any:
        """After-AOT levels 2 (a region that raises) and 3 (every region): Dynamo's minifier
        launcher for the region's ATen graph; the exception (level 2) says where it is."""
        inputs = _cloned(args)  # before the region may write its inputs
        if self.repro_level == 3:
            log.warning("kiln: %s", self._write_launcher(inputs))
        try:
            return self.compiled(*args)
        except Exception as exc:
            if self.repro_level == 2:
                exc.add_note(f"kiln: {self.label}region {self.name} raised. {self._write_launcher(inputs)}")
            raise

    def _write_launcher(self, inputs: Sequence[Any]) -> str:
        dump_to_minify_after_dynamo(fx.GraphModule(self.eager, self.eager.graph), list(inputs), "kiln")
        return (f"Minifier launcher for {self.label}region {self.name}'s ATen graph (minifies it with "
                f"backend='kiln'): python {get_minifier_repro_path()}")

    def _report(self, position: int, problem: str, args: Sequence[Any]) -> str:
        lines = [f"kiln verify: {self.label}region {self.name}, output {position}: {problem}."]
        culprit = first_differing_kernel(self.compiled, self.kernels, args)
        if culprit is None:
            lines.append("Every kernel matches loopir's reference evaluator on its inputs, so the lowering "
                         "(the kernel graph against the region's ATen ops) or an extern call differs.")
        else:
            kernel, buffer, detail = culprit
            text = str(self.kernels[kernel])
            if len(text) > MAX_KERNEL_TEXT:
                text = text[:MAX_KERNEL_TEXT] + "\n  ..."
            lines.append(f"First kernel whose outputs differ from loopir's reference evaluator: {kernel}, "
                         f"buffer {buffer}: {detail}.\n{text}")
        lines.append("KILN_DEBUG=<dir> writes the generated source of every kernel.")
        return "\n".join(lines)


def _cloned(args: Sequence[Any]) -> list[Any]:
    return [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]


class _KernelReplay(fx.Interpreter):
    """Runs a compiled region node by node; after each kernel call, compares its outputs with
    loopir's reference evaluator (on CPU copies of the same inputs) and stops at the first
    kernel that differs."""

    def __init__(self, module: fx.GraphModule, kernels: dict[str, Kernel]) -> None:
        super().__init__(module)
        self.kernels = kernels
        self.culprit: tuple[str, str, str] | None = None

    def run_node(self, node: fx.Node) -> Any:
        result = super().run_node(node)
        kernel = self.kernels.get(node.name) if node.op == "call_function" else None
        if kernel is None or self.culprit is not None:
            return result
        args, _ = self.fetch_args_kwargs_from_env(node)
        host = [a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args]
        reference = kernel(*host)
        for spec, got, want in zip(kernel.outputs, result, reference):
            # The evaluator stores at the kernel's flat offsets: view them as the output's layout.
            want = want.reshape(-1).as_strided(got.shape, got.stride()) if want.numel() == got.numel() else want
            problem = difference(got, want)
            if problem is not None:
                self.culprit = (kernel.name, spec.name, problem)
                break
        return result


def first_differing_kernel(compiled: torch.nn.Module, kernels: dict[str, Kernel],
                           args: Sequence[Any]) -> tuple[str, str, str] | None:
    """(kernel, buffer, what differs) of the first kernel of `compiled` whose outputs differ
    from loopir's reference evaluator on the inputs it gets; None when every kernel matches."""
    if not isinstance(compiled, fx.GraphModule):
        return None
    replay = _KernelReplay(compiled, kernels)
    replay.run(*args)
    return replay.culprit
