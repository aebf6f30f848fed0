"""Round trip of every graph of small Hugging Face models (random weights, tiny configs).

transformers is not a dependency of kiln-capture: these tests are skipped, saying so,
when it is not installed (the package-alone test environment); the repository-wide
``nox -s tests`` environment has it. Nothing is downloaded: models are built from configs.
"""

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: HF model round-trip tests skipped"
)

from kiln.capture import capture, load, save, verify  # noqa: E402


def _ids(*shape):
    return torch.randint(0, 100, shape)


#: name -> (model builder, example inputs builder). Configs are tiny so the suite stays fast.
MODELS = {
    "bert": (
        lambda: transformers.BertModel(
            transformers.BertConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                vocab_size=100,
                max_position_embeddings=64,
            )
        ),
        lambda: (_ids(2, 8),),
    ),
    "gpt2": (
        lambda: transformers.GPT2Model(
            transformers.GPT2Config(
                n_embd=32,
                n_layer=2,
                n_head=2,
                vocab_size=100,
                n_positions=64,
                bos_token_id=0,
                eos_token_id=0,
            )
        ),
        lambda: (_ids(2, 8),),
    ),
    "t5": (
        lambda: transformers.T5Model(
            transformers.T5Config(
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=2,
                vocab_size=100,
                decoder_start_token_id=0,
            )
        ),
        lambda: (_ids(2, 8), None, _ids(2, 4)),
    ),
    "llama": (
        lambda: transformers.LlamaModel(
            transformers.LlamaConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                intermediate_size=64,
                vocab_size=100,
                max_position_embeddings=64,
            )
        ),
        lambda: (_ids(2, 8),),
    ),
    "vit": (
        lambda: transformers.ViTModel(
            transformers.ViTConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                image_size=16,
                patch_size=8,
            )
        ),
        lambda: (torch.randn(2, 3, 16, 16),),
    ),
    "resnet": (
        lambda: transformers.ResNetModel(
            transformers.ResNetConfig(
                embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic"
            )
        ),
        lambda: (torch.randn(2, 3, 32, 32),),
    ),
    "convnext": (
        lambda: transformers.ConvNextModel(
            transformers.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2)
        ),
        lambda: (torch.randn(2, 3, 32, 32),),
    ),
}


def capture_model(name, dynamic=None):
    """The model (eval mode, seeded weights), its inputs, and its Capture."""
    build_model, build_inputs = MODELS[name]
    torch.manual_seed(0)
    model = build_model().eval()
    inputs = build_inputs()
    with torch.no_grad():
        result = capture(model, *inputs, dynamic=dynamic)
    return model, inputs, result


def flat_tensors(outputs):
    return [t for t in torch.utils._pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_graph_round_trips_with_identical_outputs(name, tmp_path):
    model, inputs, result = capture_model(name)
    assert result.graphs, f"{name}: no graph captured"
    for graph in result.graphs:
        path = save(graph, tmp_path / f"{name}_{graph.index}.kcg")
        loaded = load(path)
        verify(loaded)
        assert loaded.gm.code == graph.gm.code
        assert loaded.input_specs() == graph.input_specs()
        assert [n.name for n in loaded.gm.graph.nodes] == [n.name for n in graph.gm.graph.nodes]
        with torch.no_grad():
            expected = flat_tensors(graph.gm(*graph.example_inputs))
            actual = flat_tensors(loaded.gm(*loaded.example_inputs))
        assert len(actual) == len(expected) > 0
        for a, e in zip(actual, expected):
            assert torch.equal(a, e), f"{name} graph {graph.index}: outputs differ after load"
    if len(result.graphs) == 1:
        # One graph computes the whole model: it must match the model itself too.
        with torch.no_grad():
            eager = flat_tensors(model(*inputs))
            (graph,) = result.graphs
            captured = flat_tensors(load(tmp_path / f"{name}_0.kcg").gm(*graph.example_inputs))
        assert any(torch.equal(c, eager[0]) for c in captured)


def test_dynamic_bert_round_trips_and_runs_other_sequence_lengths(tmp_path):
    model, inputs, result = capture_model("bert", dynamic=True)
    (graph,) = result.graphs
    loaded = load(save(graph, tmp_path / "bert_dynamic.kcg"))
    assert loaded.input_specs() == graph.input_specs()
    symbolic = [spec for spec in loaded.input_specs() if spec.kind == "int"]
    assert symbolic, "dynamic=True gives symbolic sizes"
    with torch.no_grad():
        expected = flat_tensors(
            graph.gm(
                *[
                    int(v.node.hint) if isinstance(v, torch.SymInt) else v
                    for v in graph.example_inputs
                ]
            )
        )
        actual = flat_tensors(loaded.gm(*loaded.example_inputs))
    assert all(torch.equal(a, e) for a, e in zip(actual, expected, strict=True))


def test_report_of_a_model_names_its_inputs_and_parameters():
    _, _, result = capture_model("bert")
    text = result.report()
    assert "1 graph, 0 graph breaks" in text
    # input_ids, then 39 parameters and the position_ids / token_type_ids buffers
    assert ": i64[2, 8] + 41 parameters/buffers\n" in text
    assert "  13 x torch._C._nn.linear\n" in text
