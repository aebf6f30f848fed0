"""Semantics where kiln once differed from eager (issue 15): gradients of parameters the loss
never reaches, and the variance of values near the float maximum."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import explain

CODEGENS = ["cpu", "cuda", "reference"]


class _EncoderWithPooler(torch.nn.Module):
    """As HF BERT/ALBERT: a pooler output the loss often ignores (only the hidden states used)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(8, 8)
        self.pooler = torch.nn.Linear(8, 8)

    def forward(self, x):
        hidden = self.encoder(x).relu()
        return hidden, self.pooler(hidden[:, 0]).tanh()


@pytest.mark.parametrize("codegen", CODEGENS)
def test_parameters_the_loss_never_reaches_keep_none_gradients(codegen):
    options = {"fallback": False, "codegen": codegen}
    torch.manual_seed(0)
    eager_model = _EncoderWithPooler()
    model = _EncoderWithPooler()
    model.load_state_dict(eager_model.state_dict())
    x = torch.randn(2, 4, 8)
    assert explain(model, x, options=options).kernel_count >= 1
    compiled = torch.compile(model, backend="kiln", options=options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    pooler_before = model.pooler.weight.detach().clone()

    hidden, _ = compiled(x)
    hidden.square().sum().backward()
    eager_hidden, _ = eager_model(x)
    eager_hidden.square().sum().backward()

    assert model.pooler.weight.grad is None and model.pooler.bias.grad is None
    assert eager_model.pooler.weight.grad is None
    torch.testing.assert_close(model.encoder.weight.grad, eager_model.encoder.weight.grad)
    optimizer.step()  # weight decay and momentum leave a parameter with no gradient alone
    assert torch.equal(model.pooler.weight, pooler_before)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_an_output_used_by_the_loss_still_gets_its_gradient(codegen):
    model = _EncoderWithPooler()
    x = torch.randn(2, 4, 8)
    compiled = torch.compile(model, backend="kiln", options={"fallback": False, "codegen": codegen})
    hidden, pooled = compiled(x)
    (pooled.sum() + hidden.sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    hidden, pooled = model(x)
    (pooled.sum() + hidden.sum()).backward()
    for got, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad)


@pytest.mark.parametrize("codegen", CODEGENS)
@pytest.mark.parametrize("value", [3e38, 3e37, 1e30])
def test_variance_of_values_near_the_float_maximum_does_not_overflow(codegen, value):
    """Eager's Welford gives 0 for a constant row of huge values; a plain two-pass sum overflows
    (inf), or squares its rounding error into an overflow."""
    x = torch.full((4, 48), value)
    x[1] = -value

    def statistics(x):
        return x.var(-1), torch.var_mean(x, -1, correction=0), x.std(1, keepdim=True)

    options = {"fallback": False, "codegen": codegen}
    assert explain(statistics, x, options=options).kernel_count >= 1
    got = torch.compile(statistics, backend="kiln", options=options)(x)
    torch.testing.assert_close(got, statistics(x))
    assert torch.equal(got[0], torch.zeros(4))


@pytest.mark.parametrize("codegen", ["cpu", "cuda"])
def test_variance_of_a_large_mean_and_a_small_spread_matches_eager(codegen):
    """Cancellation: a shifted two-pass keeps the digits that a mean of 1e4 would eat."""
    x = 1e4 + torch.randn(8, 4096) * 1e-2
    got = torch.compile(lambda t: t.var(-1), backend="kiln", options={"fallback": False, "codegen": codegen})(x)
    torch.testing.assert_close(got, x.double().var(-1).float(), rtol=1e-3, atol=0)
    torch.testing.assert_close(got, x.var(-1), rtol=1e-3, atol=0)


@pytest.mark.parametrize("codegen", ["cpu", "cuda"])
def test_std_under_dynamic_shapes_compiles(codegen):
    """torch's std decomposition divides by a symbolic float under dynamic shapes, which loopir
    does not lower (found by tools/fuzz.py); kiln's is the square root of its var."""
    compiled = torch.compile(lambda t: t.std(-1), backend="kiln", dynamic=True,
                             options={"fallback": False, "codegen": codegen})
    for x in (torch.randn(5), torch.randn(9)):
        torch.testing.assert_close(compiled(x), x.std(-1))
