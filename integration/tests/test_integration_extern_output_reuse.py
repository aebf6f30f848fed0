"""A pointwise kernel stores into the dead matmul output it reads (loopir's
`plan_extern_output_reuse`, the `reuse_extern_outputs` capability), as Inductor's kernels do
(`in_out_ptr0`): on the C++ codegen and the Triton codegen (its interpreter on the CPU, the GPU
under ``KILN_INTEGRATION_TEST_DEVICE=cuda``), eager's values on every call, results the caller
holds never written over, and eager's gradients. Also a scatter writing into its dead base
(`scatter_into_dead_bases`: an embedding's gradient scattered into its zero fill, not a copy)."""

from __future__ import annotations

import pytest
import torch

from kiln.integration import backend

CODEGENS = ("cpu", "cuda")  # "cuda" is the Triton codegen; under TRITON_INTERPRET=1 on the CPU


def _randn(*shape, seed=0):
    gen = torch.Generator().manual_seed(seed)  # drawn on the CPU, then to the default device (conftest.py)
    return torch.randn(*shape, generator=gen, device="cpu").to(torch.get_default_device())


def _compile(fn, codegen):
    torch._dynamo.reset()
    calls = []

    def counting(gm, example_inputs):
        calls.append(1)
        return backend(gm, example_inputs, options={"fallback": False, "codegen": codegen})

    return torch.compile(fn, backend=counting), calls


def _spy_stores(monkeypatch, keep):
    """Each planned schedule's stores (node, input) into dead results that `keep(kernel, pair)`."""
    from kiln.loopir._internal import input_stores

    seen = []
    real = input_stores.plan_extern_output_reuse

    def spy(lowered, plan, *flags):
        result = real(lowered, plan, *flags)
        seen.append([pair for item in result.items for pair in getattr(item, "stored_inputs", ()) if keep(item, pair)])
        return result

    monkeypatch.setattr("kiln.loopir._internal.api.plan_extern_output_reuse", spy)
    return seen


@pytest.fixture
def planned(monkeypatch):
    """The (node, input) stores each planned schedule's kernels make into extern outputs."""
    return _spy_stores(monkeypatch, lambda kernel, pair: True)


@pytest.fixture
def planned_scatters(monkeypatch):
    """The stores each planned schedule's scatter nodes make into their dead bases."""
    from kiln.loopir import Scatter

    return _spy_stores(monkeypatch, lambda kernel, pair: any(
        node.name == pair[0] and isinstance(node.body, Scatter) for node in kernel.nodes))


def _gated_mlp(x, w1, w2, w3):
    return (torch.nn.functional.silu(x @ w1) * (x @ w2)) @ w3


def _gate_returned(x, w1, w2):
    g = x @ w1  # returned: the kernel reading it must not write over it
    return g, torch.sigmoid(g) * (x @ w2)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_a_kernel_writes_into_the_dead_matmul_output_it_reads(planned, codegen):
    """The SiLU * up node of a gated MLP stores into the gate matmul's output (dead once read):
    eager's values on three calls with new inputs (a codegen's pool or the caching allocator
    hands the storage out again between calls)."""
    weights = (_randn(64, 128, seed=1) / 8, _randn(64, 128, seed=2) / 8, _randn(128, 64, seed=3) / 8)
    compiled, calls = _compile(_gated_mlp, codegen)
    with torch.no_grad():
        for seed in range(3):
            x = _randn(32, 64, seed=10 + seed)
            torch.testing.assert_close(compiled(x, *weights), _gated_mlp(x, *weights), rtol=1e-4, atol=1e-4)
    assert calls
    assert planned and len(planned[0]) == 1, planned  # the product written into a matmul's output


@pytest.mark.parametrize("codegen", CODEGENS)
def test_a_matmul_result_the_caller_gets_is_never_written_over(planned, codegen):
    w1, w2 = _randn(64, 128, seed=1) / 8, _randn(64, 128, seed=2) / 8
    compiled, calls = _compile(_gate_returned, codegen)
    x = _randn(32, 64, seed=4)
    with torch.no_grad():
        got = compiled(x, w1, w2)
    torch.testing.assert_close(got, _gate_returned(x, w1, w2), rtol=1e-4, atol=1e-4)
    assert calls and planned
    assert len(planned[0]) == 1, planned  # into the dead up matmul's output, not the returned gate


def _relu_mlp(x, w1, w2, w3):
    return torch.relu(torch.relu(x @ w1) @ w3) @ w2


@pytest.mark.parametrize("codegen", CODEGENS)
def test_gradients_with_kernels_writing_into_matmul_outputs_match_eager(planned, codegen):
    """A ReLU MLP: each ReLU writes into the matmul result it reads (forward), each ReLU's
    backward into the incoming gradient's matmul result (backward); the gradients are eager's
    over two steps."""
    weights = [torch.nn.Parameter(_randn(*shape, seed=s) / 16) for s, shape in
               enumerate(((64, 128), (64, 128), (128, 64)))]
    reference = [w.detach().clone().requires_grad_() for w in weights]
    x = _randn(32, 64, seed=7)
    compiled, calls = _compile(_relu_mlp, codegen)
    for _ in range(2):
        for w in weights:
            w.grad = None
        compiled(x, *weights).square().mean().backward()
    _relu_mlp(x, *reference).square().mean().backward()
    assert calls and [len(stores) for stores in planned] == [2, 2], planned  # forward, backward
    for got, want in zip(weights, reference):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5)


# A scatter writes into its dead base instead of a copy of it (`scatter_into_dead_bases`, a
# capability of both codegens; the Triton codegen's since session 22, checked on an H200).

def test_the_capability_is_both_codegens():
    from kiln.codegen_cpp._internal.plugin import CODEGEN as CPP
    from kiln.codegen_triton import CODEGEN as TRITON

    assert CPP.capabilities.scatter_into_dead_bases
    assert TRITON.capabilities.scatter_into_dead_bases


@pytest.mark.parametrize("codegen", CODEGENS)
def test_an_embedding_gradient_scatters_into_its_zero_fill(planned_scatters, codegen):
    """nn.Embedding trained with `fallback=False`: the weight's gradient is the zero fill's
    buffer, scattered into; eager's gradients on three calls (a pool or the caching allocator
    hands the storage out again between calls), the ids and the incoming gradient unchanged."""
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(50, 16)
    reference = torch.nn.Embedding(50, 16)
    reference.load_state_dict(embedding.state_dict())
    compiled, calls = _compile(lambda ids, w: (embedding(ids) * w).sum(), codegen)
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 50, (4, 9), generator=gen, device="cpu").to(torch.get_default_device())
        w = _randn(4, 9, 16, seed=seed)
        kept = ids.clone(), w.clone()
        embedding.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        compiled(ids, w).backward()
        (reference(ids) * w).sum().backward()
        torch.testing.assert_close(embedding.weight.grad, reference.weight.grad)
        assert torch.equal(ids, kept[0]) and torch.equal(w, kept[1])
    assert calls
    assert any(planned_scatters), "no scatter was planned into its dead base"
