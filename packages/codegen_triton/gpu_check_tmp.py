"""Temporary: run the differential cases on a real GPU (compiled Triton, not the interpreter)."""
import os
import sys
import traceback

sys.path[:0] = ["packages/loopir/src", "packages/codegen_triton/src", "packages/codegen_triton/tests"]
import types  # noqa: E402


def load(path):
    source = open(path).read().replace('os.environ["TRITON_INTERPRET"] = "1"', "pass")
    module = types.ModuleType(path)
    exec(compile(source, path, "exec"), module.__dict__)
    return module


P = load("packages/codegen_triton/tests/test_codegen_triton_pointwise.py")
R = load("packages/codegen_triton/tests/test_codegen_triton_reduction.py")
assert "TRITON_INTERPRET" not in os.environ
import tempfile  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from kiln.codegen_triton import TritonOptions, verify  # noqa: E402
from kiln.codegen_triton import compile as kiln_compile  # noqa: E402
from kiln.loopir import lower  # noqa: E402

print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
dev = "cuda"
failures = []


def run(name, fn, args, options, mode="real", rtol=2e-5, atol=2e-5, shapes=None):
    try:
        kg = lower(make_fx(fn, tracing_mode=mode)(*args))
        module = kiln_compile(kg, options)
        verify(module)
        for n in module.graph.nodes:
            if hasattr(n.target, "jit_function"):
                assert type(n.target.jit_function).__name__ == "JITFunction", type(n.target.jit_function)
        for call_args in [args] + (shapes or []):
            exp, got = fn(*call_args), module(*call_args)
            exp = exp if isinstance(exp, (tuple, list)) else (exp,)
            got = got if isinstance(got, (tuple, list)) else (got,)
            for g, e in zip(got, exp):
                assert g.device == e.device, (g.device, e.device)
                torch.testing.assert_close(g, e, equal_nan=True, rtol=rtol, atol=atol)
        print("ok  ", name)
    except Exception:
        failures.append(name)
        print("FAIL", name)
        traceback.print_exc()


cache = tempfile.mkdtemp()
small = TritonOptions(cache_dir=cache, xblock=16, reduction_xblock=4, rblock=8)
default = TritonOptions(cache_dir=cache)
for opt_name, opt in [("small", small), ("default", default)]:
    for name, fn in sorted(P.ELEMENTWISE.items()):
        for shape in [(7, 9), (300, 41)]:
            run(f"{opt_name} pw {name} {shape}", fn, (torch.randn(*shape, device=dev), torch.randn(*shape, device=dev)), opt)
    for name, fn in sorted(R.REDUCTIONS.items()):
        for shape in [(5, 19, 6), (33, 517, 3)]:
            run(f"{opt_name} red {name} {shape}", fn, (torch.randn(*shape, device=dev),), opt, rtol=1e-4, atol=1e-4)
x64 = torch.randn(3, 1000, dtype=torch.float64, device=dev)
run("f64 sum", lambda x: x.sum(1), (x64,), small, rtol=1e-12, atol=1e-12)
run("f64 consts", lambda x: x * 0.1 + 1e-9, (x64,), small, rtol=0, atol=0)
a = torch.randint(-1000, 1000, (6, 21), device=dev); b = torch.randint(-1000, 1000, (6, 21), device=dev)
run("int/bool", lambda a, b, x: (a.sum(1), torch.amax(a, 1), torch.amin(a, 0), (x > 0).sum(1), torch.maximum(a * 3 + b, b - 2), torch.where(a > b, a, b * 2), torch.logical_not(x > 0)), (a, b, torch.randn(6, 21, device=dev)), small, rtol=0, atol=0)
xn = torch.randn(4, 20, device=dev); xn[1, 17] = float("nan"); xn[3, 0] = float("nan")
run("nan reductions", lambda x: (torch.amax(x, 1), torch.amin(x, 1), x.sum(1)), (xn,), small)
xp = torch.tensor([1.0, float("nan"), 3.0, -1.0, float("nan")], device=dev); yp = torch.tensor([float("nan"), 2.0, 1.0, -2.0, float("nan")], device=dev)
run("nan pointwise", lambda x, y: (torch.maximum(x, y), torch.minimum(x, y), torch.relu(x)), (xp, yp), small)
vals = [-30.0, -3.0, -0.5, -0.13, -0.12, -1e-3, -1e-9, 0.0, 1e-9, 1e-3, 0.12, 0.13, 0.5, 3.0, 30.0]
run("tanh f32", torch.tanh, (torch.tensor(vals, device=dev),), small, rtol=2e-6, atol=0)
run("tanh f64", torch.tanh, (torch.tensor(vals, device=dev, dtype=torch.float64),), small, rtol=1e-14, atol=0)
base = torch.tensor([2.0, -2.0, -2.0, 0.0, 0.0, 0.0, 1.0, -1.5, float("nan"), 3.0, 4.0], device=dev)
expo = torch.tensor([3.0, 3.0, 2.0, 0.0, 2.0, -1.0, float("nan"), 0.5, 0.0, -2.0, 0.5], device=dev)
run("pow tensor", torch.pow, (base, expo), small)
run("views", (lambda x, y: ((x.t() + y), x[:, 1:4] * 2, x.unsqueeze(0).expand(3, -1, -1) + 1, (x + 1).t().reshape(-1), x.select(1, 2) - y.select(0, 1))), (torch.randn(5, 6, device=dev), torch.randn(6, 5, device=dev)), small)
run("broadcast", lambda x, r, c, s: x * r + c - s, (torch.randn(4, 5, 6, device=dev), torch.randn(6, device=dev), torch.randn(5, 1, device=dev), torch.randn((), device=dev)), small)
run("dyn pointwise", lambda x, y: torch.sigmoid(x) * y.t() + 1, (torch.randn(4, 5, device=dev), torch.randn(5, 4, device=dev)), small, mode="symbolic",
    shapes=[(torch.randn(r, c, device=dev), torch.randn(c, r, device=dev)) for r, c in [(7, 3), (1, 9), (1000, 33)]])
run("dyn reduction", lambda x: x.sum(1) + torch.amax(x, 1), (torch.randn(4, 9, device=dev),), small, mode="symbolic",
    shapes=[(torch.randn(*s, device=dev),) for s in [(3, 30), (11, 2), (1, 1), (64, 4097)]], rtol=1e-4, atol=1e-4)
run("fused", lambda x, y: (torch.sigmoid(x) * y + 1.0).sum(-1) / x.sum(-1) + x.mean(-1), (torch.randn(6, 11, device=dev), torch.randn(6, 11, device=dev)), small, rtol=1e-4, atol=1e-4)
run("softmax", lambda x: (lambda e: e / e.sum(-1, keepdim=True))(torch.exp(x - torch.amax(x, -1, keepdim=True))), (torch.randn(77, 1300, device=dev),), default)
run("empty", lambda x: (x * 2, x.sum(0)), (torch.randn(0, 5, device=dev),), small)
run("sum empty dim", lambda x: x.sum(1), (torch.randn(3, 0, device=dev),), small)
run("constant only", lambda x: (torch.full((3, 4), 2.5, device=dev), x + 1), (torch.randn(2, device=dev),), small)
run("big full reduction", lambda x: (x.sum(), x.mean()), (torch.randn(1 << 20, device=dev),), default, rtol=1e-4, atol=1e-3)
print("FAILURES:", failures)
