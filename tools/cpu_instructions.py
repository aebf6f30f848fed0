"""Instructions executed by kiln's and Inductor's generated C++ kernels, per bench row (valgrind).

Timings on a shared 2-core machine are noise; instruction counts are not. For each row of
`tools/bench.py` (or those whose name contains `--rows`), a child process under
`valgrind --tool=callgrind` compiles the workload with kiln and with Inductor, warms both up with
instrumentation off, then counts the instructions of `--calls` calls of each, inside the generated
kernel functions only (kiln's `kernel<N>`, Inductor's `kernel`; `--toggle-collect`), libm and
libgomp calls made from them included, ATen externs (mm, conv) excluded.

Valgrind 3.19 has no AVX-512, so both compile for AVX2 (`-march=x86-64-v3`): kiln through a
patched build command, Inductor through `config.cpp.march` and `config.cpp.simdlen = 256`.
Code is generated for 2 threads (as the bench runs) and run on 1 (`OMP_THREAD_LIMIT=1`), so the
counts are per graph call on one thread; `regions` counts the OpenMP parallel regions opened per
call (calls to GOMP_parallel*). Instructions are not cycles: a memory-bound row hides a gap in
instructions, and divisions, gathers or unaligned accesses cost more than one.

    python tools/cpu_instructions.py --rows rmsnorm layer_norm --calls 3 [--kernels 5]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import Any

import torch
import torch._inductor.config as inductor_config

from kiln.codegen_cpp._internal import api
from kiln.integration import backend as kiln_backend

MARCH = "x86-64-v3"  # AVX2 + FMA: what valgrind can run
CLIENT_REQUESTS = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_dump(const char* what) { CALLGRIND_DUMP_STATS_AT(what); }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
"""


# -- the parent: one valgrind child per row, then the table --------------------------------


@dataclasses.dataclass
class Counts:
    """One backend's counts for one row, per graph call."""

    instructions: float  # in the generated kernels
    regions: float
    kernels: dict[str, float]
    everything: float  # the whole call: Python, the runtime, allocations, ATen externs (mm, conv)


@dataclasses.dataclass(frozen=True)
class Library:
    """One library of generated kernels: its function symbols (`nm`, addresses relative to the
    library, as callgrind writes them)."""

    label: str
    symbols: tuple[tuple[int, int, str], ...]  # (start, end, name), sorted

    @classmethod
    def read(cls, path: str) -> Library:
        listing = subprocess.run(["nm", "-S", "--defined-only", path], capture_output=True, text=True).stdout
        symbols = []
        for row in listing.splitlines():
            parts = row.split()
            if len(parts) == 4 and parts[2] in "tTwW":
                begin = int(parts[0], 16)
                symbols.append((begin, begin + int(parts[1], 16), parts[3]))
        # kiln: the library's cache key (a training step has a forward and a backward library,
        # each with its kernel0, ...); Inductor: the library's name (one kernel each)
        library = pathlib.Path(path)
        label = f"kiln {library.parent.name[:6]}" if library.name == "kernels.so" else library.name[:10]
        return cls(label, tuple(sorted(symbols)))

    def kernel_at(self, address: int) -> str | None:
        """The kernel an address belongs to (an OpenMP body or a cold part is its kernel's);
        None inside the Python glue (Inductor's kernel_py)."""
        name = next((symbol for begin, end, symbol in self.symbols if begin <= address < end), "?")
        if name.startswith(GLUE):
            return None
        return self.label + ":" + re.sub(r"(\._omp_fn\.\d+|\.cold)+$", "", name)


GLUE = ("kernel_py", "_ZL9kernel_py", "PyInit_", "_GLOBAL__sub_I")


def parse_callgrind(path: pathlib.Path, libraries: dict[str, Library], calls: int) -> Counts:
    """Per-call instructions executed inside the generated libraries, plus what they call outside
    them (libm, libmvec, memcpy), from a dump made with `--dump-instr=yes --compress-pos=no
    --compress-strings=no`, attributed by address. Calls into libgomp are counted as parallel
    regions (GOMP_parallel*) and their cost left out: the OpenMP bodies they run are generated
    code, counted by address, and the rest is libgomp's bookkeeping on one thread.

    A kernel called through ctypes is charged by callgrind to libffi's unnamed trampoline (it
    does not see the call: libffi switches stacks), with addresses relative to the kernel's own
    library: such lines are told apart by their source file (kiln's kernels are built with -g;
    libffi has no line information)."""
    sources = {str(pathlib.Path(p).with_suffix(".cpp")): p for p in libraries}
    kernels: collections.Counter = collections.Counter()
    regions = everything = 0
    library: Library | None = None
    through_ffi: Library | None = None  # the generated library last seen inside libffi's frame
    in_ffi = False
    call: tuple[str, int, bool] | None = None  # (callee, count, callee inside a generated library)
    callee_object = callee = current_object = ""
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        if key == "ob":
            current_object = callee_object = value
            library, in_ffi = libraries.get(value), "libffi" in value
        elif key == "fn":
            callee_object, through_ffi = current_object, None
            library = libraries.get(current_object)
        elif key in ("fl", "fi", "fe") and in_ffi:
            if value in sources:
                through_ffi = libraries[sources[value]]
            library = through_ffi if value != "???" else None
        elif key == "cob":
            callee_object = value
        elif key == "cfn":
            callee = value
        elif key == "calls":
            call = (callee, int(value.split()[0]), callee_object in libraries)
            callee_object = current_object
        elif line.startswith("summary:"):
            everything = int(line.split()[1])
        elif line.startswith("0x"):
            address, _, cost = line.split()[:3]
            kernel = library.kernel_at(int(address, 16)) if library else None
            if kernel is not None and call is None:
                kernels[kernel] += int(cost)
            elif kernel is not None:
                callee_name, count, inside = call
                if callee_name.startswith("GOMP_parallel"):
                    regions += count
                elif not callee_name.startswith("GOMP_") and not inside:
                    kernels[kernel] += int(cost)
            call = None
    per_call = {kernel: cost / calls for kernel, cost in kernels.items()}
    return Counts(sum(per_call.values()), regions / calls, per_call, everything / calls)


def run_children(rows: list[str], calls: int, work: pathlib.Path, valgrind: str) -> dict[str, dict[str, Counts]]:
    """Counts per row and backend. One child process handles every row (valgrind's start, torch's
    import and the translation of Dynamo's code are paid once): first natively, filling both
    backends' caches, then under valgrind, where every compile is a cache hit."""
    out = work / "callgrind.out"
    env = dict(os.environ, OMP_THREAD_LIMIT="1", OMP_WAIT_POLICY="passive",
               TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"), TORCHINDUCTOR_FX_GRAPH_CACHE="1")
    child_command = [sys.executable, __file__, "--calls", str(calls), "--work", str(work), "--child", *rows]
    valgrind_command = [valgrind, "--tool=callgrind", "--instr-atstart=no", "--dump-instr=yes",
                        "--compress-pos=no", "--compress-strings=no", f"--callgrind-out-file={out}"]
    for command in (child_command + ["--warm-only"], valgrind_command + child_command):
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"the child failed: {' '.join(command)}\n{result.stderr[-3000:]}")
    measured = json.loads((work / "measured.json").read_text())
    paths = json.loads((work / "libraries.json").read_text())
    libraries = {backend: {path: Library.read(path) for path in paths[backend]} for backend in paths}
    dumps = sorted(work.glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
    counts: dict[str, dict[str, Counts]] = collections.defaultdict(dict)
    for (row, backend), dump in zip(measured, dumps):
        counts[row][backend] = parse_callgrind(dump, libraries[backend], calls)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="*", default=[], help="substrings of bench row names (default: all)")
    parser.add_argument("--calls", type=int, default=3, help="measured calls per backend")
    parser.add_argument("--kernels", type=int, default=0, help="also list each backend's N costliest kernels")
    parser.add_argument("--valgrind", default="/usr/bin/valgrind")
    parser.add_argument("--keep", help="keep the child's files (dumps, generated code) in this new folder")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        return child(options.child, options.calls, pathlib.Path(options.work), measure=not options.warm_only)
    names = [name for name, _ in row_table() if not options.rows or any(s in name for s in options.rows)]
    with contextlib.ExitStack() as stack:
        if options.keep:
            work = pathlib.Path(options.keep)
            work.mkdir(parents=True)
        else:
            work = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kiln-cg-")))
        counts = run_children(names, options.calls, work, options.valgrind)
        elements = json.loads((work / "elements.json").read_text())
    print(f"instructions per graph call in generated kernels (callgrind, -march={MARCH}, 1 thread, "
          f"{options.calls} calls); Ir/elem: per element of the row's largest input; all Ir: the whole "
          "call (Python, runtime, allocations, ATen externs such as mm)")
    print("| row | kiln Ir | inductor Ir | kiln/inductor | kiln Ir/elem | inductor Ir/elem "
          "| kiln kernels | inductor kernels | kiln regions | inductor regions | kiln all Ir | inductor all Ir |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        kiln, inductor = counts[name]["kiln"], counts[name]["inductor"]
        size = elements[name]
        print(f"| {name} | {kiln.instructions:,.0f} | {inductor.instructions:,.0f} | "
              f"{kiln.instructions / max(inductor.instructions, 1):.2f} | {kiln.instructions / size:.2f} | "
              f"{inductor.instructions / size:.2f} | {len(kiln.kernels)} | {len(inductor.kernels)} | "
              f"{kiln.regions:g} | {inductor.regions:g} | {kiln.everything:,.0f} | {inductor.everything:,.0f} |")
    for name in names:
        for backend, count in counts[name].items():
            top = sorted(count.kernels.items(), key=lambda item: -item[1])[:options.kernels]
            for kernel, cost in top:
                print(f"| {name} | {backend} {kernel} | {cost:,.0f} |")
    return 0


# -- the child, under valgrind ---------------------------------------------------------------


def row_table() -> list[tuple[str, functools.partial]]:
    """(name, a thunk making (fn, args, training)) for every bench row, built lazily: the child
    builds only its own row's suite (the HF models take a while under valgrind)."""
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import bench_cpu_rows
    import workloads

    def suite_rows(suite: str) -> list[tuple[str, Any, tuple, bool]]:
        if suite == "micro":
            return [(n, f, a, False) for n, f, a in workloads.workloads("cpu")]
        if suite == "wide":
            return ([(n, f, a, False) for n, f, a in bench_cpu_rows.inference_rows("cpu")]
                    + [(n, f, a, True) for n, f, a in bench_cpu_rows.training_rows("cpu")])
        return [(n, f, a, False) for n, f, a in workloads.model_workloads("cpu")]

    names = {"micro": [n for n, _, _ in workloads.workloads("cpu")],
             "wide": [n for n, _, _ in bench_cpu_rows.inference_rows("cpu")]
             + [n for n, _, _ in bench_cpu_rows.training_rows("cpu")],
             "models": ["bert 4L d256 4x128", "gpt2 4L d256 4x128", "llama 4L d256 4x128"]}
    return [(name, functools.partial(lambda s, n: next(r for r in suite_rows(s) if r[0] == n), suite, name))
            for suite, rows in names.items() for name in rows]


def client_requests(work: pathlib.Path) -> ctypes.CDLL:
    source = work / "client_requests.c"
    source.write_text(CLIENT_REQUESTS)
    library = work / "client_requests.so"
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return ctypes.CDLL(str(library))


def kiln_for_avx2() -> None:
    """Build kiln's C++ for -march=x86-64-v3 instead of -march=native (AVX-512 here), with -g."""
    original = api.build_library

    def build_for_valgrind(source, options):
        # -g: line information, which tells kiln's code apart inside libffi's frame (parse_callgrind)
        flags = (*(f"-march={MARCH}" if flag == "-march=native" else flag for flag in options.flags), "-g")
        return original(source, dataclasses.replace(options, flags=flags))

    api.build_library = build_for_valgrind


def child(rows: list[str], calls: int, work: pathlib.Path, measure: bool) -> int:
    torch.set_num_threads(2)  # code generated for the bench's 2 threads; OMP_THREAD_LIMIT=1 runs 1
    inductor_config.cpp.march = MARCH
    inductor_config.cpp.simdlen = 256
    kiln_for_avx2()
    table = dict(row_table())
    requests = client_requests(work) if measure else None
    elements, measured = {}, []
    for row in rows:
        _, fn, args, training = table[row]()
        elements[row] = max(a.numel() for a in args)
        with contextlib.nullcontext() if training else torch.no_grad():
            measured += measure_row(row, fn, args, calls, work, requests)
    (work / "elements.json").write_text(json.dumps(elements))
    (work / "measured.json").write_text(json.dumps(measured))
    maps = pathlib.Path("/proc/self/maps").read_text().splitlines()
    (work / "libraries.json").write_text(json.dumps(
        {backend: sorted({line.split()[-1] for line in maps if line.split()[-1].startswith(str(work / backend))})
         for backend in ("kiln", "inductor")}))
    return 0


def measure_row(row: str, fn: Any, args: tuple, calls: int, work: pathlib.Path,
                requests: ctypes.CDLL | None) -> list[tuple[str, str]]:
    """Compile `fn` with both backends, warm them up, and (with `requests`) count `calls` calls of
    each: one callgrind dump per backend, in the order returned. (A dump holds one backend's
    calls of one row, so every generated library of that backend can be searched in it.)"""
    results = []
    torch._dynamo.reset()
    kiln_options = {"cache_dir": str(work / "kiln"), "fallback": False}
    compiled = {"kiln": torch.compile(fn, backend=functools.partial(kiln_backend, options=kiln_options)),
                "inductor": torch.compile(fn, backend="inductor")}
    for backend, compiled_fn in compiled.items():
        for _ in range(2):
            compiled_fn(*args)
        if requests is None:
            continue
        requests.cg_start()
        for _ in range(calls):
            compiled_fn(*args)
        requests.cg_dump(f"{row} {backend}".encode())
        requests.cg_stop()
        results.append((row, backend))
    return results


if __name__ == "__main__":
    sys.exit(main())
