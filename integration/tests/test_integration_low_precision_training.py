"""An autocast-bfloat16 training step of a tiny Hugging Face Llama (random weights, nothing
downloaded) through kiln's C++ codegen with `fallback=False`: loss and gradients match eager
within bfloat16 tolerance, and the activations the forward saves for the backward stay in
bfloat16 where eager saves bfloat16 (no float32 upcast of a bfloat16 value is saved, no float32
tensor eager does not save in float32, no more bytes than eager saves)."""

from __future__ import annotations

import copy

import pytest
import torch

import kiln.autograd_trace._internal.runtime as autograd_runtime
from kiln.integration import KilnOptions
from kiln.integration._internal.backend import _compile


class _RecordingBackend:
    """kiln on the C++ codegen, fallback=False, keeping each graph's report."""

    def __init__(self) -> None:
        self.options = KilnOptions.create({"codegen": "cpu", "fallback": False})
        self.reports = []

    def __call__(self, gm, example_inputs):
        return _compile(gm, example_inputs, self.options, self.reports.append)


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, max_position_embeddings=32,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config), torch.randint(0, 100, (2, 16))


def _eager_saved_tensors(model, ids):
    """Loss of one eager autocast step and the tensors autograd saved for its backward."""
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    return loss, saved


def _activation_bytes(tensors, inputs):
    """Bytes of the distinct storages among `tensors` that are not storages of `inputs`."""
    input_storages = {t.untyped_storage().data_ptr() for t in inputs}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors
                if t.untyped_storage().data_ptr() not in input_storages}
    return sum(storages.values())


def _saved_upcasts(partition):
    """Saved float32 values the forward made by casting a bfloat16 value up."""
    nodes = {n.name: n for n in partition.fw_gm.graph.nodes}
    upcasts = []
    for value in partition.saved:
        node = nodes.get(value.name)
        if value.kind != "tensor" or node is None or node.target is not torch.ops.aten._to_copy.default:
            continue
        source = node.args[0].meta["val"]
        if source.dtype == torch.bfloat16 and node.meta["val"].dtype == torch.float32:
            upcasts.append(value.name)
    return upcasts


def test_autocast_llama_training_step_matches_eager_and_saves_bfloat16(monkeypatch):
    model, ids = _tiny_llama()
    reference = copy.deepcopy(model)
    partitions = []
    partition_joint = autograd_runtime.partition_joint
    monkeypatch.setattr(autograd_runtime, "partition_joint",
                        lambda joint, strategy: partitions.append(partition_joint(joint, strategy)) or partitions[-1])
    backend = _RecordingBackend()
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.compile(model, backend=backend)(input_ids=ids, labels=ids).loss
    loss.backward()  # compiles the backward: fallback=False raises on any op left to eager
    expected, eager_saved = _eager_saved_tensors(reference, ids)
    expected.backward()

    assert backend.reports and all(r.compiled and r.training and not r.fallback_nodes for r in backend.reports)
    assert sum(r.kernels for r in backend.reports) >= 10
    torch.testing.assert_close(loss, expected, rtol=1e-2, atol=1e-2)
    for (name, got), want in zip(model.named_parameters(), reference.parameters(), strict=True):
        scale = float(want.grad.abs().max())
        assert float((got.grad - want.grad).abs().max()) <= 0.03 * scale + 1e-5, name

    (partition,) = partitions
    saved = [v for v in partition.saved if v.kind == "tensor"]
    assert any(v.dtype == "bfloat16" for v in saved)
    assert not _saved_upcasts(partition)
    eager_float32_shapes = {tuple(t.shape) for t in eager_saved if t.dtype == torch.float32}
    for value in saved:
        if value.dtype == "float32" and not value.is_input:
            assert tuple(value.shape) in eager_float32_shapes, str(value)
    inputs = [*reference.parameters(), *reference.buffers(), ids]
    assert partition.activation_bytes <= _activation_bytes(eager_saved, inputs)
