"""Layouts where eager's reshape copies (issue 15): a norm over the last dim of a permuted
(channels-last) tensor, then a linear layer, as in HF ConvNeXt. The traced graph views the norm's
output; kiln's decomposition keeps the input's layout, so the view becomes a reshape that copies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.decomp import LOOP_LEVEL_OPS, check_opset, decompose, loop_level
from kiln.integration import explain


def _norm_then_linear(x, weight):
    features = F.layer_norm(x.permute(0, 2, 3, 1), x.shape[1:2])  # (N, H, W, C), channels last
    return F.linear(features, weight).permute(0, 3, 1, 2)


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_decompose_reshapes_a_view_of_a_differently_laid_out_value(mode):
    x, weight = torch.randn(2, 8, 5, 5), torch.randn(12, 8)
    gm = make_fx(_norm_then_linear, tracing_mode=mode)(x, weight)
    assert torch.ops.aten.view.default in {n.target for n in gm.graph.nodes}
    out = decompose(gm, loop_level())
    check_opset(out, LOOP_LEVEL_OPS)
    torch.testing.assert_close(out(x, weight), _norm_then_linear(x, weight))


@pytest.mark.parametrize("codegen", ["cpu", "cuda"])
def test_norm_of_a_channels_last_tensor_then_linear_compiles(codegen):
    x, weight = torch.randn(2, 8, 5, 5), torch.randn(12, 8)
    options = {"fallback": False, "codegen": codegen}
    report = explain(_norm_then_linear, x, weight, options=options)
    assert report.eager_graphs == () and report.kernel_count >= 1
    got = torch.compile(_norm_then_linear, backend="kiln", options=options)(x, weight)
    torch.testing.assert_close(got, _norm_then_linear(x, weight))


def test_hugging_face_convnext_compiles_whole_and_matches_eager():
    import transformers  # a test dependency of kiln (kiln[test])

    torch.manual_seed(0)
    config = transformers.ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
                                         image_size=32, patch_size=4)
    model = transformers.ConvNextModel(config).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        report = explain(model, x)
        assert report.eager_graphs == () and report.kernel_count >= 5, str(report)
        torch._dynamo.reset()
        got = torch.compile(model, backend="kiln", options={"fallback": False})(x)
        expected = model(x)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, rtol=1e-4, atol=1e-4)
