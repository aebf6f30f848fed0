"""Issue 20's done-when: tiny HF BERT and GPT-2 training steps with dropout on (C++ codegen,
fallback=False) compile their random ops into kiln kernels: no dropout (or other random op)
falls back to eager, forward or backward. BERT's forward and backward have no fallback at all
(its embedding backward is a scatter, now a kiln kernel too)."""

from __future__ import annotations

import logging
import math
import re

import pytest
import torch

from kiln.integration import backend, explain

PIPELINE_LOG = "kiln.integration._internal.pipeline"
RANDOM = re.compile(r"\b(rand|randn|randint|bernoulli|dropout|native_dropout|uniform|normal|exponential)\b")


def _compiled(fn):
    return torch.compile(fn, backend=lambda gm, ex: backend(gm, ex, options={"fallback": False, "codegen": "cpu"}))


def _bert(transformers):
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.1,
                                     attention_probs_dropout_prob=0.1, attn_implementation="eager")
    return transformers.BertForMaskedLM(config).train()


def _gpt2(transformers):
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, resid_pdrop=0.1,
                                     embd_pdrop=0.1, attn_pdrop=0.1, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config).train()


def _training_step(model, caplog, backward_counts):
    """(forward report, backward graphs' fallback lines and counts) of one training step."""
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(0))

    def step(ids):
        return model(input_ids=ids, labels=ids).loss

    report = explain(step, ids, options={"fallback": False, "codegen": "cpu"})
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger=PIPELINE_LOG):
        loss = _compiled(step)(ids)
        loss.backward()
    assert math.isfinite(loss.item())
    counts = backward_counts(caplog.text)
    assert counts, caplog.text
    return report, counts


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_training_step_with_dropout_has_no_random_fallbacks(name, caplog, backward_counts):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = (_bert if name == "bert" else _gpt2)(transformers)
    report, backward = _training_step(model, caplog, backward_counts)
    assert all(graph.training for graph in report.graphs), str(report)
    assert report.kernel_count >= 10, str(report)
    random_fallbacks = [str(n) for n in report.fallback_nodes if RANDOM.search(str(n))]
    assert not random_fallbacks, str(report)
    fallback_lines = [line for line in caplog.text.splitlines() if "fallback:" in line]
    assert not [line for line in fallback_lines if RANDOM.search(line)], caplog.text
    if name == "bert":  # nothing at all falls back, forward or backward
        assert not report.fallback_nodes, str(report)
        assert all(fallbacks == 0 for _, fallbacks in backward), caplog.text
