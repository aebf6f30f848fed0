"""`nox -s fuzz`: a differential fuzzer. Random programs, compiled by kiln, compared with eager.

Each program is a few lines of PyTorch over one to three random inputs, drawn from pointwise
ops, reductions, views, indexing, cat/stack, softmax and norms, casts, matmuls (with kernels
reading their results), and in-place ops (on inputs too). A program is grown one line at a time, each line kept only if eager runs it, so
every program is valid eager code. Inputs are contiguous, channels-last (4-d) or transposed
(their last two dims' strides swapped), so layouts other than the default reach every op. Each
runs through one configuration, round robin over {C++ codegen, Triton interpreter} x {static
shapes, dynamic shapes}, with `fallback=False`, and kiln's outputs (and the inputs it mutated)
are compared with eager's: values, and significant strides (issue 19: a compiled output keeps
eager's layout; `torch._prims_common.check_significant_strides`). A value outside tolerance
of eager's still counts as right where it is no farther than eager's from the program run with
its float32 inputs in float64 (float32 eager is off at times, e.g. its gelu far from 0).

Casts to bfloat16 are left out of programs run on Triton's interpreter (its bfloat16 casts are
wrong: float32 truncated, float64 garbage; a GPU's are right).

Outcomes: ok; wrong (values differ: a kiln bug, printed with the program); wrong_strides
(values equal, an output's significant strides differ from eager's); kiln error (kiln
raised, counted by category); Dynamo refused (Dynamo itself would not trace the program);
no kernels (kiln compiled the graph but generated no kernel, e.g. a program of views only).

    python tools/fuzz.py --programs 2000 --seed 0 [--workers 8] [--jsonl results.jsonl] [--show-errors]
    python tools/fuzz.py --seed 0 --minimize 123   # program 123 of that run, shrunk
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import multiprocessing
import os
import random
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton codegen runs on CPU tensors

import torch  # noqa: E402

from kiln.integration import explain  # noqa: E402

FAILING = ("wrong", "wrong_strides")  # outcomes that make the run fail
CODEGENS = ("cpu", "cuda")  # kiln codegen names: C++, and Triton (its interpreter on CPU tensors)
SIZES = (1, 2, 3, 4, 5, 7, 8, 16)
SIZES_4D = (1, 2, 3, 4, 5, 7)  # 4-d inputs (the channels-last ones) stay within 2,401 elements
LAYOUTS = ("contiguous", "channels_last", "transposed")

# Templates by how they use their operands. `{a}`/`{b}`: values; `{d}`/`{e}`: dims of `{a}`;
# `{k}`: keepdim. Discontinuous ops (floor, comparisons into casts, argmax) only take exact
# values (inputs and what exact ops made of them): after rounding differences of a few ulp
# they would legitimately differ from eager by a whole step.
UNARY = ("torch.sin({a})", "torch.exp({a}.clamp(-10, 10))", "torch.tanh({a})", "torch.sigmoid({a})",
         "torch.relu({a})", "-{a}", "torch.sqrt({a}.abs())", "torch.log1p({a}.abs())", "{a} * 2.5",
         "{a} + 1", "torch.nn.functional.gelu({a})", "torch.clamp({a}, -0.5, 0.5)", "torch.erf({a})",
         "torch.where({a} > 0, {a}, 0.1 * {a})", "{a}.pow(2)", "torch.rsqrt({a}.abs() + 1)",
         "torch.nn.functional.silu({a})", "torch.cos({a}) * {a}")
EXACT_UNARY = ("torch.abs({a})", "-{a}", "{a}.contiguous()", "{a}.clone()")
DISCONTINUOUS = ("torch.floor({a} * 4)", "torch.round({a} * 3)", "({a} > 0).float()",
                 "{a}.to(torch.int32) * 3", "({a} * 8).to(torch.int64).float()",
                 "torch.sign({a})", "{a}.argmax({d}, keepdim={k}).float()",
                 "{a}.max({d}, keepdim={k})[1].float()", "{a}.min({d})[1] * 2",
                 "torch.where({a} > {b}, {a}, {b})", "torch.maximum({a}, {b})")
BINARY = ("{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / ({b}.abs() + 1)", "torch.minimum({a}, {b})",
          "torch.atan2({a}, {b})", "torch.lerp({a}, {b}, 0.3)", "torch.addcmul({a}, {a}, {b}, value=0.5)")
REDUCTIONS = ("{a}.sum({d}, keepdim={k})", "{a}.mean({d}, keepdim={k})", "{a}.amax({d}, keepdim={k})",
              "{a}.amin({d}, keepdim={k})", "{a}.max({d}, keepdim={k})[0]", "{a}.var({d}, keepdim={k})",
              "{a}.std({d})", "torch.logsumexp({a}, {d}, keepdim={k})", "{a}.sum()", "{a}.mean()",
              "{a}.norm(dim={d})", "{a}.cumsum({d})", "{a}.prod({d}, keepdim={k})", "{a}.abs().amax()")
VIEWS = ("{a}.transpose({d}, {e})", "{a}.reshape(-1)", "{a}.unsqueeze({d})", "{a}.flatten()",
         "{a}.t()", "{a}[..., ::2]", "{a}[1:]", "{a}.narrow({d}, 1, 1)", "{a}.flip({d})",
         "{a}.unsqueeze(0).expand(2, *{a}.shape)", "{a}.squeeze()", "{a}.movedim({d}, -1)",
         "{a}.reshape({a}.shape[0], -1)", "{a}.view(-1, 1)", "{a}.select({d}, 0)", "{a}.diagonal()")
INDEXING = ("{a}[{index}]", "torch.index_select({a}, {d}, {index})", "{a}.masked_fill({a} > 0.5, 0.0)",
            "{a}.roll(1, {d})", "torch.gather({a}, {d}, torch.zeros_like({a}, dtype=torch.int64))",
            "{a}.tril()", "{a}[{index}] * {a}[0]")
CAT = ("torch.cat([{a}, {b}], {d})", "torch.cat([{a}, {a} * 2], {d})", "torch.stack([{a}, {b}], {d})",
       "torch.cat([{a}, {a}.flip({d})], {d})")
NORMS = ("torch.softmax({a}, {d})", "torch.log_softmax({a}, {d})",
         "torch.nn.functional.layer_norm({a}, {a}.shape[-1:])", "torch.nn.functional.normalize({a}, dim={d})",
         "torch.nn.functional.rms_norm({a}, {a}.shape[-1:])", "torch.nn.functional.group_norm({a}, 1)")
CASTS = ("{a}.double()", "{a}.half().float()", "{a}.bfloat16().float()", "{a}.to(torch.float64) * 1.5",
         "{a}.float()")
INPLACE = ("{a}.add_(1)", "{a}.mul_(0.5)", "{a}.clamp_(-1, 1)", "{a}.sub_({b})", "{a}.copy_({a} * 2)",
           "{a}.relu_()", "{a}.div_(2)")
INPLACE_VIEW = ("{a}[0].zero_()", "{a}.select(-1, 0).fill_(3.0)", "{a}[..., :1].mul_(2)")
# Matmuls (ATen externs inside kiln's regions) with kernels reading their results: where a kernel
# may store into a dead matmul output (codegen_cpp's reuse_extern_outputs), and where it may not.
MATMULS = ("{a} @ {a}.transpose(-1, -2)", "{a}.transpose(-1, -2) @ {b}", "torch.relu({a} @ {b}.transpose(-1, -2)) * 2",
           "torch.sigmoid({a} @ {a}.transpose(-1, -2)) * ({a} @ {b}.transpose(-1, -2))")
GROUPS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("unary", UNARY, 3), ("binary", BINARY, 3), ("reduction", REDUCTIONS, 2.5), ("view", VIEWS, 2.5),
    ("indexing", INDEXING, 1), ("cat", CAT, 1), ("norm", NORMS, 1.5), ("cast", CASTS, 0.7),
    ("discontinuous", DISCONTINUOUS, 1), ("exact", EXACT_UNARY, 0.5), ("matmul", MATMULS, 1))
EXACT_TEMPLATES = set(VIEWS) | set(EXACT_UNARY) | {"{a}[{index}]", "torch.index_select({a}, {d}, {index})",
                                                    "{a}.roll(1, {d})", "{a}.tril()",
                                                    "torch.cat([{a}, {a}.flip({d})], {d})"}


@dataclasses.dataclass
class Program:
    """A random program: input specs, then lines assigning `v<i>`, then the returned values."""

    seed: int
    inputs: list[tuple[Any, ...]]  # (shape, dtype name[, layout]) of x0, x1, ...; layout: LAYOUTS
    lines: list[str]
    outputs: list[str]

    def source(self) -> str:
        args = ", ".join(f"x{i}" for i in range(len(self.inputs)))
        body = "".join(f"    {line}\n" for line in self.lines)
        return f"def program({args}):\n{body}    return ({', '.join(self.outputs)},)\n"

    def function(self) -> Callable[..., Any]:
        namespace: dict[str, Any] = {"torch": torch}
        exec(compile(self.source(), f"<fuzz program {self.seed}>", "exec"), namespace)
        return namespace["program"]

    def make_inputs(self) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed)
        return [laid_out(torch.randn(spec[0], generator=generator, dtype=getattr(torch, spec[1])), _layout(spec))
                for spec in self.inputs]

    def repro(self) -> str:
        specs = ", ".join(f"torch.randn({list(s[0])}, dtype=torch.{s[1]}, generator=g){_LAYOUT_SOURCE[_layout(s)]}"
                          for s in self.inputs)
        return (f"import torch\n{self.source()}\ng = torch.Generator().manual_seed({self.seed})\n"
                f"args = [{specs}]\n")


_LAYOUT_SOURCE = {"contiguous": "", "channels_last": ".contiguous(memory_format=torch.channels_last)",
                  "transposed": ".transpose(-1, -2).contiguous().transpose(-1, -2)"}


def _layout(spec: tuple[Any, ...]) -> str:
    return spec[2] if len(spec) > 2 else "contiguous"


def laid_out(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """`tensor`'s values in `layout` (LAYOUTS): the same values, other strides."""
    if layout == "channels_last":
        return tensor.contiguous(memory_format=torch.channels_last)
    if layout == "transposed":
        return tensor.transpose(-1, -2).contiguous().transpose(-1, -2)
    return tensor


def _fill(template: str, rng: random.Random, names: list[str], values: dict[str, torch.Tensor]) -> str | None:
    a = rng.choice(names)
    tensor = values[a]
    same_shape = [n for n in names if values[n].shape == tensor.shape and n != a]
    b = rng.choice(same_shape + [a] if rng.random() < 0.7 else names)
    rank = max(tensor.dim(), 1)
    d, e = rng.randrange(-rank, rank), rng.randrange(rank)
    index_dim = tensor.shape[d] if tensor.dim() else 1
    count = rng.randint(1, 4)
    index = f"torch.tensor({[rng.randrange(max(index_dim, 1)) for _ in range(count)]})"
    try:
        return template.format(a=a, b=b, d=d, e=e, k=rng.random() < 0.5, index=index)
    except (IndexError, KeyError):
        return None


def _eval(expression: str, values: dict[str, torch.Tensor]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return eval(expression, {"torch": torch}, dict(values))


def generate(seed: int, bfloat16: bool = True) -> Program:
    """A random program valid in eager (each line kept only if eager runs it on the inputs);
    `bfloat16=False` leaves out casts to bfloat16."""
    rng = random.Random(seed)
    inputs = []
    for _ in range(rng.randint(1, 3)):
        rank = rng.randint(1, 4)
        dtype = "float64" if rng.random() < 0.1 else "float32"
        shape = tuple(rng.choice(SIZES if rank < 4 else SIZES_4D) for _ in range(rank))
        if inputs and rng.random() < 0.6:
            shape = inputs[0][0]  # same shapes make binary ops and cat likelier to apply
        inputs.append((shape, dtype, _pick_layout(rng, len(shape))))
    program = Program(seed, inputs, [], [])
    values = {f"x{i}": t for i, t in enumerate(program.make_inputs())}
    exact = set(values)
    if rng.random() < 0.35:
        _add_inplace(program, rng, values, INPLACE_VIEW if rng.random() < 0.3 else INPLACE)
    for step in range(rng.randint(2, 8)):
        for _attempt in range(10):
            if _add_line(program, rng, values, exact, f"v{step}", bfloat16):
                break
    if rng.random() < 0.15:
        _add_inplace(program, rng, values, INPLACE)
    produced = [n for n in values if n.startswith("v")]
    program.outputs = rng.sample(produced, k=min(len(produced), rng.randint(1, 2))) if produced else ["x0 * 1"]
    return program


def _pick_layout(rng: random.Random, rank: int) -> str:
    """Half the 4-d inputs channels-last; a quarter of the other inputs of rank >= 2 transposed."""
    if rank == 4 and rng.random() < 0.5:
        return "channels_last"
    return "transposed" if rank >= 2 and rng.random() < 0.25 else "contiguous"


def _add_line(program: Program, rng: random.Random, values: dict[str, torch.Tensor], exact: set[str],
              name: str, bfloat16: bool) -> bool:
    group = rng.choices(GROUPS, weights=[g[2] for g in GROUPS])[0]
    template = rng.choice(group[1])
    if not bfloat16 and "bfloat16" in template:
        return False
    floats = [n for n, t in values.items() if t.is_floating_point() and t.numel() > 0]
    candidates = [n for n in floats if n in exact] if group[0] == "discontinuous" else floats
    if not candidates:
        return False
    expression = _fill(template, rng, candidates, values)
    if expression is None:
        return False
    try:
        value = _eval(expression, values)
    except Exception:
        return False
    if not isinstance(value, torch.Tensor) or value.numel() > 4096 or value.dim() > 4:
        return False
    values[name] = value
    if template in EXACT_TEMPLATES and all(n in exact for n in re.findall(r"\b[xv]\d+\b", expression)):
        exact.add(name)
    program.lines.append(f"{name} = {expression}")
    return True


def _add_inplace(program: Program, rng: random.Random, values: dict[str, torch.Tensor],
                 templates: tuple[str, ...]) -> None:
    floats = [n for n, t in values.items() if t.is_floating_point()]
    expression = _fill(rng.choice(templates), rng, floats, values)
    if expression is None:
        return
    try:  # a failing in-place op raises before it writes (aliasing, broadcasting, dtype checks)
        _eval(expression, values)
    except Exception:
        return
    program.lines.append(expression)


# ----------------------------------------------------------------------------- running


@dataclasses.dataclass
class Outcome:
    seed: int
    codegen: str
    dynamic: bool
    kind: str  # ok, wrong, wrong_strides, kiln_error, dynamo_refused, no_kernels
    category: str = ""
    detail: str = ""
    seconds: float = 0.0


def _tolerance(dtype: torch.dtype, float64_only: bool) -> tuple[float, float]:
    """float64 tolerances only for programs computing in float64 throughout: a float64 output
    cast from a float32 value carries float32's rounding."""
    if dtype == torch.float64 and float64_only:
        return 1e-7, 1e-9
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    return 1e-4, 1e-5


def _compare(kiln: Any, eager: Any, float64_only: bool, exact: list[Any] | None = None) -> str | None:
    """None if equal within tolerance, or (given `exact`, the program's outputs in float64) no
    farther from the float64 result than eager's; else what differs."""
    for i, (got, want) in enumerate(zip(kiln, eager, strict=True)):
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"output {i}: {got.dtype}{list(got.shape)} vs eager {want.dtype}{list(want.shape)}"
        rtol, atol = _tolerance(want.dtype, float64_only)
        try:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
        except AssertionError as exc:
            if exact is None or not _no_farther_from_float64(got, want, exact[i], rtol, atol):
                return f"output {i}: {str(exc).splitlines()[-3:]}"
    return None


def _no_farther_from_float64(got: torch.Tensor, want: torch.Tensor, exact: Any, rtol: float, atol: float) -> bool:
    """Whether kiln's `got` is, element by element, no farther (beyond tolerance) from the
    program's float64 result than eager's `want`: float32 eager is itself off at times (its
    gelu at -3.92 by 0.4%, which a sqrt then shows), and kiln may be the closer one."""
    if not isinstance(exact, torch.Tensor) or not got.is_floating_point() or exact.shape != got.shape:
        return False
    exact = exact.double()
    kiln_error, eager_error = (got.double() - exact).abs(), (want.double() - exact).abs()
    return bool(((kiln_error <= eager_error + atol + rtol * exact.abs()) | (got.isnan() & want.isnan())).all())


def _float64_outputs(program: Program) -> list[Any] | None:
    """The program's outputs and inputs (as `run_one` compares them) with its float32 inputs
    made float64, or None where that run fails."""
    inputs = [t.double() if t.dtype == torch.float32 else t for t in program.make_inputs()]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return list(program.function()(*inputs)) + inputs
    except Exception:  # noqa: BLE001 - no float64 referee then: the mismatch stands
        return None


def _compare_strides(kiln: Any, eager: Any, eager_inputs: list[torch.Tensor]) -> tuple[str, str] | None:
    """None if every output's significant strides (those of dims longer than 1) equal eager's,
    else (the kind of difference, what differs)."""
    for i, (got, want) in enumerate(zip(kiln, eager, strict=True)):
        same, _dim = torch._prims_common.check_significant_strides(got, want, only_cuda=False)
        if not same:
            detail = f"output {i} {list(want.shape)}: strides {got.stride()} where eager gives {want.stride()}"
            return _stride_cause(want, eager_inputs), detail
    return None


def _stride_cause(want: torch.Tensor, eager_inputs: list[torch.Tensor]) -> str:
    """Why an output's strides can differ: eager returns a view (of an input, or of a value the
    program computed) where kiln returns a copy, or a computed value's layout differs."""
    storage = want.untyped_storage().data_ptr()
    if any(storage == t.untyped_storage().data_ptr() for t in eager_inputs):
        return "eager returns a view of an input"
    if want._base is not None:
        return "eager returns a view of an intermediate"
    return "a computed output's layout differs"


_NUMBERS = re.compile(r"\d+")


def _category(exc: BaseException) -> tuple[str, str]:
    """(kind, category) of an exception raised while kiln compiled or ran a program."""
    dynamo_exc = torch._dynamo.exc
    inner = exc.inner_exception if isinstance(exc, dynamo_exc.BackendCompilerFailed) else None
    if inner is None and isinstance(exc, (dynamo_exc.Unsupported, dynamo_exc.UserError,
                                          dynamo_exc.TorchRuntimeError)):
        return "dynamo_refused", f"{type(exc).__name__}: {_first_line(exc)}"
    cause = inner if inner is not None else exc
    return "kiln_error", f"{type(cause).__name__}: {_first_line(cause)}"


def _first_line(exc: BaseException) -> str:
    line = (str(exc).strip().splitlines() or [""])[0]
    line = re.sub(r"'[^']*'", "'…'", line)
    return _NUMBERS.sub("N", line)[:140]


def run_one(program: Program, codegen: str, dynamic: bool) -> Outcome:
    function = program.function()
    eager_inputs = program.make_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's own (var's degrees of freedom, ...)
        eager = list(function(*eager_inputs)) + eager_inputs
    kiln_inputs = program.make_inputs()
    captured: list[Any] = []

    def captured_program(*args: torch.Tensor) -> Any:
        result = function(*args)
        captured.append(result)
        return result

    outcome = Outcome(program.seed, codegen, dynamic, "ok")
    options = {"fallback": False, "codegen": codegen}
    try:
        with torch._dynamo.config.patch(assume_static_by_default=not dynamic), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = explain(captured_program, *kiln_inputs, options=options)
    except Exception as exc:  # noqa: BLE001 - every failure is classified and counted
        outcome.kind, outcome.category = _category(exc)
        outcome.detail = str(exc)[:2000]
        return outcome
    if not captured:
        outcome.kind, outcome.category = "dynamo_refused", "no output captured"
        return outcome
    float64_only = all(spec[1] == "float64" for spec in program.inputs) and not re.search(
        r"float\(\)|half|bfloat16|int32|int64|float32", program.source())
    mismatch = _compare(list(captured[-1]) + kiln_inputs, eager, float64_only)
    if mismatch is not None and not float64_only:
        mismatch = _compare(list(captured[-1]) + kiln_inputs, eager, float64_only, _float64_outputs(program))
    strides = _compare_strides(list(captured[-1]) + kiln_inputs, eager, eager_inputs)
    if mismatch is not None:
        outcome.kind, outcome.detail = "wrong", mismatch
    elif strides is not None:
        outcome.kind, (outcome.category, outcome.detail) = "wrong_strides", strides
    elif report.kernel_count == 0:
        outcome.kind = "no_kernels"
    return outcome


def minimize(program: Program, codegen: str, dynamic: bool) -> Program:
    """A smaller program with the same outcome (kind and category): lines dropped one at a time
    while it persists (a line another still uses makes the program invalid, and stays)."""
    target = run_one(program, codegen, dynamic)
    key = (target.kind, target.category)
    changed = True
    while changed:
        changed = False
        for i in range(len(program.lines)):
            name = program.lines[i].split(" = ")[0] if " = " in program.lines[i] else None
            outputs = [o for o in program.outputs if o != name] or program.outputs
            candidate = dataclasses.replace(program, lines=program.lines[:i] + program.lines[i + 1:], outputs=outputs)
            try:
                candidate.function()(*candidate.make_inputs())
            except Exception:  # noqa: BLE001 - an invalid candidate is simply not taken
                continue
            outcome = run_one(candidate, codegen, dynamic)
            if (outcome.kind, outcome.category) == key:
                program, changed = candidate, True
                break
    return program


def _triton_interpreter(codegen: str) -> bool:
    """Whether `codegen` runs on Triton's interpreter, whose casts to bfloat16 are wrong (float32
    is truncated, not rounded to nearest even; float64 gives garbage): not kiln's to test."""
    return codegen == "cuda"  # the fuzzer's tensors live on the CPU


def configurations(index: int) -> tuple[str, bool]:
    """Round robin over codegens x {static, dynamic} shapes."""
    return CODEGENS[index % 2], bool((index // 2) % 2)


def run_index(seed: int, index: int) -> tuple[Program, Outcome]:
    """Program `index` of the run seeded `seed`, through its configuration."""
    started = time.perf_counter()
    codegen, dynamic = configurations(index)
    program = generate(seed * 1_000_003 + index, bfloat16=not _triton_interpreter(codegen))
    outcome = run_one(program, codegen, dynamic)
    outcome.seconds = round(time.perf_counter() - started, 2)
    return program, outcome


def fuzz(programs: int, seed: int, workers: int = 1) -> Iterator[tuple[Program, Outcome]]:
    """Every program's (program, outcome), in order when `workers` is 1, else as they finish
    (each worker a process of its own, one torch thread each)."""
    if workers <= 1:
        for index in range(programs):
            yield run_index(seed, index)
        return
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_one_thread) as pool:
        futures = [pool.submit(run_index, seed, index) for index in range(programs)]
        for future in concurrent.futures.as_completed(futures):
            yield future.result()


def _one_thread() -> None:
    torch.set_num_threads(1)


def summarize(outcomes: list[Outcome]) -> str:
    lines = [f"{len(outcomes)} programs"]
    by_config = collections.Counter((o.codegen, "dynamic" if o.dynamic else "static", o.kind) for o in outcomes)
    for (codegen, shapes, kind), count in sorted(by_config.items()):
        lines.append(f"  {codegen:5} {shapes:8} {kind:15} {count}")
    kinds = collections.Counter(o.kind for o in outcomes)
    lines.append("totals: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    for kind in ("wrong_strides", "kiln_error", "dynamo_refused"):
        categories = collections.Counter(o.category for o in outcomes if o.kind == kind)
        if categories:
            lines.append(f"{kind} by category:")
            lines += [f"  {count:5}  {category}" for category, count in categories.most_common()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jsonl", help="append one JSON line per program here")
    parser.add_argument("--show-errors", action="store_true", help="print each kiln error's program")
    parser.add_argument("--workers", type=int, default=1, help="processes running programs in parallel")
    parser.add_argument("--minimize", type=int, metavar="INDEX",
                        help="shrink program INDEX of this seed's run to the fewest lines with its outcome")
    args = parser.parse_args(argv)
    _one_thread()
    if args.minimize is not None:
        codegen, dynamic = configurations(args.minimize)
        program = generate(args.seed * 1_000_003 + args.minimize, bfloat16=not _triton_interpreter(codegen))
        small = minimize(program, codegen, dynamic)
        outcome = run_one(small, codegen, dynamic)
        print(f"{outcome.kind} ({codegen}, dynamic={dynamic}): {outcome.category}\n{small.repro()}")
        return 0
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    with open(args.jsonl, "a") if args.jsonl else contextlib.nullcontext() as log:
        for program, outcome in fuzz(args.programs, args.seed, args.workers):
            outcomes.append(outcome)
            if log is not None:
                log.write(json.dumps({**dataclasses.asdict(outcome), "program": program.repro()}) + "\n")
                log.flush()
            if outcome.kind in FAILING or (args.show_errors and outcome.kind == "kiln_error"):
                print(f"--- {outcome.kind} ({outcome.codegen}, dynamic={outcome.dynamic}): "
                      f"{outcome.category}{outcome.detail[:600]}\n{program.repro()}", flush=True)
    print(summarize(outcomes))
    print(f"{time.perf_counter() - started:.0f} s")
    return 1 if any(o.kind in FAILING for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
