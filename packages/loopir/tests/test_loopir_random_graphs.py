"""Random compositions of pointwise ops, views and reductions (fixed seeds), lowered with static
and symbolic shapes and compared with eager, at the traced sizes and at other sizes."""

from __future__ import annotations

import random

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.loopir import lower, verify

UNARY = [torch.exp, torch.tanh, torch.sigmoid, torch.relu, torch.neg, torch.abs,
         lambda t: t * 2.5, lambda t: t + 1, lambda t: (t > 0).float()]
BINARY = [torch.add, torch.mul, torch.sub, torch.maximum, torch.minimum,
          lambda a, b: torch.where(a > b, a, b)]
VIEWS = [
    lambda t: t.t() if t.dim() == 2 else t,
    lambda t: t[..., 1:] if t.shape[-1] > 1 else t,
    lambda t: t[::2] if t.shape[0] > 2 else t,
    lambda t: t[-1] if t.dim() >= 2 else t,
    lambda t: t.reshape(-1),
    lambda t: t.unsqueeze(0).expand(2, *t.shape),
]
REDUCTIONS = [lambda t: t.sum(-1), lambda t: t.sum(-1, keepdim=True), lambda t: t.amax(0),
              lambda t: t.mean(-1, keepdim=True)]


def random_program(seed: int):
    def program(x, y):
        rng = random.Random(seed)
        values = [x, y]
        for _ in range(rng.randint(3, 8)):
            a, kind = rng.choice(values), rng.random()
            if kind < 0.3:
                values.append(rng.choice(UNARY)(a))
            elif kind < 0.55:
                b = rng.choice(values)
                op = rng.choice(BINARY)
                compatible = all(p == q or 1 in (p, q) for p, q in zip(a.shape[::-1], b.shape[::-1]))
                values.append(op(a, b) if compatible else op(a, a))
            elif kind < 0.8:
                values.append(rng.choice(VIEWS)(a))
            elif a.dim() >= 1 and a.numel() > 0:
                values.append(rng.choice(REDUCTIONS)(a))
        return values[-1], values[-2] + 0  # the second output may be a view: keep it a new tensor

    return program


@pytest.mark.parametrize("seed", range(40))
def test_random_program(seed):
    program = random_program(seed)
    x, y = torch.randn(4, 6), torch.randn(6)
    expected = program(x, y)
    kg = lower(make_fx(program)(x, y))
    verify(kg)
    torch.testing.assert_close(kg(x, y), expected)
    kg = lower(make_fx(program, tracing_mode="symbolic")(x, y))
    verify(kg)
    torch.testing.assert_close(kg(x, y), expected)
    x, y = torch.randn(5, 7), torch.randn(7)
    torch.testing.assert_close(kg(x, y), program(x, y))
