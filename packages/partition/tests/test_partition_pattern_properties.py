"""Property test: exact rewrite rules applied to random programs keep graphs valid and exact."""

from __future__ import annotations

import torch
import torch.fx as fx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.partition import Pattern, PatternSet

UNARY = {"relu": torch.relu, "neg": torch.neg}
BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}


@st.composite
def programs(draw):
    n_inputs = draw(st.integers(1, 3))
    steps = []
    for k in range(draw(st.integers(1, 16))):
        live = n_inputs + k
        op = draw(st.sampled_from(sorted(UNARY) + sorted(BINARY)))
        # Prefer recent values so chains (and back-to-back matches) are common.
        pick = st.integers(max(0, live - 3), live - 1)
        steps.append((op, draw(pick), draw(pick)))
    outputs = draw(st.lists(st.integers(n_inputs, n_inputs + len(steps) - 1), min_size=1, max_size=3))
    return n_inputs, steps, sorted(set(outputs))


def program_fn(steps, outputs):
    def fn(*inputs):
        values = list(inputs)
        for op, i, j in steps:
            values.append(UNARY[op](values[i]) if op in UNARY else BINARY[op](values[i], values[j]))
        return tuple(values[k] for k in outputs)

    return fn


def exact_rules() -> PatternSet:
    """Rewrites that are exact in IEEE arithmetic (so results must be bit-equal)."""
    one, two = (torch.randn(3),), (torch.randn(3), torch.randn(3))
    rules = PatternSet()
    rules.add(Pattern(lambda a: torch.relu(torch.relu(a)), one, name="relu2"), torch.relu)
    rules.add(Pattern(lambda a: torch.neg(torch.neg(a)), one, name="neg2"), lambda a: a)
    rules.add(Pattern(lambda a: torch.add(a, a), one, name="double"), lambda a: a * 2.0)
    rules.add(Pattern(lambda a, b: torch.sub(a, b), two, name="sub"), lambda a, b: a + torch.neg(b))
    rules.add(
        Pattern(lambda a: (torch.relu(a), torch.neg(a)), one, name="relu_and_neg"),
        lambda a: (torch.clamp(a, min=0), a * -1.0),
    )
    return rules


RULES = exact_rules()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**16))
def test_exact_rewrites_keep_random_programs_valid_and_exact(program, seed):
    n_inputs, steps, outputs = program
    fn = program_fn(steps, outputs)
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(3, generator=gen) for _ in range(n_inputs)]
    gm = make_fx(fn)(*inputs)
    before = {n.name for n in gm.graph.nodes}

    found = RULES.match(gm)
    claimed = [n for m in found for n in m.nodes.values()]
    assert len(claimed) == len(set(claimed))  # non-overlapping

    done = RULES.apply(gm)
    gm.graph.lint()
    assert [m.pattern.name for m in done] == [m.pattern.name for m in found]
    for node in gm.graph.nodes:
        assert node.op != "call_function" or node.name in before or "kiln_pattern" in node.meta
    torch.testing.assert_close(gm(*inputs), fn(*inputs), rtol=0, atol=0)

    again = make_fx(fn)(*inputs)
    RULES.apply(again)
    assert again.code == gm.code  # deterministic


def test_rules_fire_on_a_known_program():
    fn = program_fn([("neg", 0, 0), ("neg", 1, 1), ("sub", 2, 0), ("relu", 3, 3), ("relu", 4, 4)], [5])
    gm = make_fx(fn)(torch.randn(3))
    done = RULES.apply(gm)
    assert sorted(m.pattern.name for m in done) == ["neg2", "relu2", "sub"]
    assert isinstance(gm, fx.GraphModule)
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), fn(x), rtol=0, atol=0)
