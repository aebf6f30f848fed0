import os
os.environ["TRITON_INTERPRET"] = "1"
import traceback
import numpy, torch, triton, triton.language as tl
print("numpy", numpy.__version__, "triton", triton.__version__)

@triton.jit
def a(out, n, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    acc = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    rnumel = 19
    for roffset in range(0, rnumel, RBLOCK):
        rindex = roffset + tl.arange(0, RBLOCK)[None, :].to(tl.int64)
        acc = acc + tl.where(rindex < rnumel, 1.0, 0.0)
    tl.store(out + tl.arange(0, XBLOCK)[:, None] + tl.zeros([XBLOCK, 1], tl.int32), tl.sum(acc, 1)[:, None])

@triton.jit
def b(out, n, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    acc = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    for roffset in range(0, n, RBLOCK):
        rindex = roffset + tl.arange(0, RBLOCK)[None, :]
        acc = acc + tl.where(rindex < n, 1.0, 0.0)
    tl.store(out + tl.arange(0, XBLOCK)[:, None], tl.sum(acc, 1)[:, None])

@triton.jit
def c(out, n, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    acc = tl.full([XBLOCK, RBLOCK], 0, tl.float32)
    for roffset in tl.range(0, n, RBLOCK):
        rindex = roffset + tl.arange(0, RBLOCK)[None, :]
        acc = acc + tl.where(rindex < n, 1.0, 0.0)
    tl.store(out + tl.arange(0, XBLOCK)[:, None], tl.sum(acc, 1)[:, None])

@triton.jit
def d(out, n, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    r = tl.arange(0, RBLOCK)[None, :]
    tl.store(out + tl.arange(0, XBLOCK)[:, None], tl.sum(tl.where(r < n, 1.0, 0.0), 1)[:, None])

@triton.jit
def e(out, n, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    r = tl.arange(0, RBLOCK)[None, :].to(tl.int64)
    tl.store(out + tl.arange(0, XBLOCK)[:, None], tl.sum(tl.where(r < n, 1.0, 0.0), 1)[:, None])

for fn in (a, b, c, d, e):
    out = torch.zeros(4)
    try:
        fn[(1,)](out, 19, XBLOCK=4, RBLOCK=8)
        print(fn.__name__ if hasattr(fn, "__name__") else fn, "ok", out.tolist())
    except Exception as exc:
        print("FAIL", getattr(fn, "fn", fn).__name__, repr(exc)[:300])
        tb = traceback.format_exc().splitlines()
        print("\n".join(tb[-14:]))
