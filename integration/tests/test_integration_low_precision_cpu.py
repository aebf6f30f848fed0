"""bfloat16/float16 on the CPU through the whole backend (issue 13's CPU done-when): softmax,
layer norm, rmsnorm, gelu and a small MLP compile to C++ kernels with no fallback under
`fallback=False` and match float32 within low-precision tolerance; an autocast-bfloat16 MLP
compiles to kernels (its linears stay externs); an autocast training step matches eager; tiny
Hugging Face models (random weights, nothing downloaded) run in bfloat16."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from kiln.integration import KilnOptions
from kiln.integration._internal.backend import _compile

LOW = [torch.bfloat16, torch.float16]
# Relative tolerance: a few units in the last place of the output dtype.
RTOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


class Recording:
    """The kiln backend on the C++ codegen with `fallback=False`, recording each graph's report
    (a fallback, or Dynamo running a graph eagerly, would let a test pass with nothing compiled)."""

    def __init__(self, fallback: bool = False) -> None:
        self.options = KilnOptions.create({"codegen": "cpu", "fallback": fallback})
        self.reports = []

    def __call__(self, gm, example_inputs):
        return _compile(gm, example_inputs, self.options, self.reports.append)

    def assert_compiled(self, min_kernels: int = 1, allowed_fallbacks: frozenset[str] = frozenset()) -> None:
        assert self.reports, "kiln compiled no graph"
        for report in self.reports:
            assert report.compiled, report.reason
            assert all(f.op in allowed_fallbacks for f in report.fallback_nodes), report.fallback_nodes
        assert sum(r.kernels for r in self.reports) >= min_kernels
        assert all('extern "C"' in r.source for r in self.reports if r.kernels), "kernels are not C++"

    @property
    def externs(self) -> int:
        return sum(r.externs for r in self.reports)


def _rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128),
                               torch.nn.Linear(128, 32), torch.nn.Softmax(-1))


def _case(name):
    """(fn, float32 inputs) of each done-when case; rows 4096 wide as in the issue's GPU rows,
    a few of them."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 4096, generator=g) * 2
    w, b = torch.randn(4096, generator=g), torch.randn(4096, generator=g)
    cases = {
        "softmax": (lambda x: torch.softmax(x, -1), (x,)),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (4096,), w, b), (x, w, b)),
        "rms_norm": (_rms_norm, (x, w)),
        "gelu": (F.gelu, (x,)),
        "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), (x,)),
        "mlp": (_mlp(), (torch.randn(16, 64, generator=g),)),
    }
    return cases[name]


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", ["softmax", "layer_norm", "rms_norm", "gelu", "gelu_tanh", "mlp"])
def test_low_precision_compiles_to_cpp_kernels_and_matches_float32(name, dtype):
    fn, args = _case(name)
    low_fn = copy.deepcopy(fn).to(dtype) if isinstance(fn, torch.nn.Module) else fn
    low_args = tuple(a.to(dtype) for a in args)
    backend = Recording()
    with torch.no_grad():
        got = torch.compile(low_fn, backend=backend)(*low_args)
        eager = low_fn(*low_args)
        reference = fn(*args)  # float32
    backend.assert_compiled()
    assert got.dtype == dtype and got.shape == reference.shape
    kiln_error = float((got.float() - reference).abs().max())
    eager_error = float((eager.float() - reference).abs().max())
    # one rounding of the float32 result, or (the MLP) what eager's own low-precision matmuls cost
    assert kiln_error <= max(2 * eager_error, RTOL[dtype] * float(reference.abs().max())), (kiln_error, eager_error)
    torch.testing.assert_close(got.float(), reference, rtol=RTOL[dtype], atol=2 * eager_error + 1e-3)


def test_autocast_mlp_compiles_to_cpp_kernels_with_linears_as_externs():
    model, x = _mlp(), torch.randn(16, 64)
    backend = Recording()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = torch.compile(model, backend=backend)(x)
        expected = model(x)
    backend.assert_compiled(min_kernels=2)
    assert backend.externs >= 2  # the two addmm/mm stay ATen calls
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


def test_autocast_training_step_matches_eager():
    model = _mlp()
    reference = copy.deepcopy(model)
    x, target = torch.randn(16, 64), torch.randn(16, 32)
    backend = Recording()
    compiled = torch.compile(model, backend=backend)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = (compiled(x) - target).square().mean()
        expected = (reference(x) - target).square().mean()
    loss.backward()
    expected.backward()
    backend.assert_compiled(min_kernels=2)
    torch.testing.assert_close(loss, expected, atol=1e-2, rtol=1e-2)
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        scale = float(want.grad.abs().max())
        assert float((got.grad - want.grad).abs().max()) <= 0.05 * scale + 1e-4, name


# -- Hugging Face models in bfloat16 inference: tiny configs, random weights ---------------------

# Ops loopir has no lowering for in any dtype (so not what this file tests), left to eager.
_NOT_LOWERED = {
    "gpt2": frozenset({"aten.as_strided.default"}),  # the views of its fused qkv projection
    "vit": frozenset({"aten.convolution.default"}),  # the patch embedding
}


def _hf_model(name):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 16))
    common = {"attn_implementation": "eager"}  # attention as matmuls and a softmax: kiln kernels
    if name == "bert":
        config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=32, **common)
        return transformers.BertModel(config), {"input_ids": ids}
    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=32,
                                         bos_token_id=0, eos_token_id=0, **common)
        return transformers.GPT2Model(config), {"input_ids": ids}
    if name == "llama":
        config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1, intermediate_size=64, max_position_embeddings=32,
                                          **common)
        return transformers.LlamaModel(config), {"input_ids": ids}
    if name == "t5":
        config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
                                       **common)
        return transformers.T5Model(config), {"input_ids": ids, "decoder_input_ids": ids}
    config = transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=64, **common)
    return transformers.ViTModel(config), {"pixel_values": torch.randn(2, 3, 16, 16)}


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "t5", "vit"])
def test_hugging_face_model_in_bfloat16(name):
    model, inputs = _hf_model(name)
    reference = copy.deepcopy(model).eval()
    model = model.eval().to(torch.bfloat16)
    low_inputs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}
    backend = Recording(fallback=True)  # fallback on: the ops in _NOT_LOWERED
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(**low_inputs).last_hidden_state
        eager = model(**low_inputs).last_hidden_state
        expected = reference(**inputs).last_hidden_state  # float32
    backend.assert_compiled(min_kernels=5, allowed_fallbacks=_NOT_LOWERED.get(name, frozenset()))
    assert got.dtype == torch.bfloat16
    kiln_error = float((got.float() - expected).abs().max())
    eager_error = float((eager.float() - expected).abs().max())
    assert kiln_error <= 2 * eager_error + 2e-2, (kiln_error, eager_error)


# -- type promotion of mixed bfloat16/float32 graphs -----------------------------------------

_MIXED = {
    "bf16_plus_fp32": lambda a, b: a + b,
    "bf16_plus_0dim_fp32": lambda a, b: a + b.sum(),  # a 0-dim tensor does not promote
    "bf16_times_python_float": lambda a, b: a * 2.5 - b.mean(),
    "where_mixed": lambda a, b: torch.where(a > b, a, b),
    "cat_mixed": lambda a, b: torch.cat([a, b], 0).softmax(-1),
    "layer_norm_fp32_weight": lambda a, b: F.layer_norm(a, (64,), b[0], b[1]),
    "cast_round_trips": lambda a, b: (a.float() * b).to(torch.bfloat16).float().to(torch.bfloat16) + a,
    "div_by_int": lambda a, b: a / torch.arange(1, 65) + b.to(torch.bfloat16),
}


@pytest.mark.parametrize("name", sorted(_MIXED))
def test_mixed_bfloat16_float32_graph_has_eagers_result_dtype(name):
    fn = _MIXED[name]
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 64, generator=g).to(torch.bfloat16), torch.randn(4, 64, generator=g)
    backend = Recording()
    torch._dynamo.reset()
    got = torch.compile(fn, backend=backend)(a, b)
    expected = fn(a, b)
    backend.assert_compiled()
    assert got.dtype == expected.dtype
    torch.testing.assert_close(got.float(), expected.float(), rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.parametrize("dtype", LOW)
def test_trunc_division_truncates_the_rounded_quotient_as_eager(dtype):
    # eager's bfloat16/float16 kernel truncates a / b rounded to the dtype (bf16(53.9) = 54 -> 54)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(4096, generator=g) * 300).to(dtype), (torch.randn(4096, generator=g) * 3).to(dtype)
    fn = lambda a, b: torch.div(a, b, rounding_mode="trunc")  # noqa: E731
    backend = Recording()
    torch._dynamo.reset()
    got = torch.compile(fn, backend=backend)(a, b)
    backend.assert_compiled()
    expected = fn(a, b)
    assert (torch.trunc(a.float() / b.float()).to(dtype) != expected).any()  # the case this tests
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("first_under_autocast", [True, False], ids=["autocast-then-float32", "float32-then-autocast"])
def test_a_graph_compiled_under_autocast_is_not_reused_without_it(tmp_path, first_under_autocast):
    """Autocast is global state outside the captured graph: Dynamo recompiles when it changes,
    and the graph text is the same. The whole-graph cache (on here, in memory and on disk) must
    not hand the bfloat16 program to a float32 call, nor the reverse (it did: a float32 call
    after an autocast one returned bfloat16 values)."""
    torch._dynamo.reset()
    model = _mlp().eval()
    x = torch.randn(16, 64)
    reports = []
    options = KilnOptions.create({"codegen": "cpu", "fallback": False, "graph_cache": True, "cache_dir": str(tmp_path)})
    compiled = torch.compile(model, backend=lambda gm, ex: _compile(gm, ex, options, reports.append))
    with torch.no_grad():
        for autocast in (first_under_autocast, not first_under_autocast):
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                out, ref = compiled(x), model(x)
            assert out.dtype == ref.dtype == (torch.bfloat16 if autocast else torch.float32)
            tolerance = RTOL[torch.bfloat16] if autocast else 1e-5
            torch.testing.assert_close(out, ref, rtol=tolerance, atol=tolerance)
    assert len(reports) == 2 and all(r.compiled and r.kernels for r in reports), reports
    assert len(list(tmp_path.rglob("*.pkl"))) == 2  # two entries: two keys
