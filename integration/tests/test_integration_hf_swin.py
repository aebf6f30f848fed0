"""HF Swin (shifted windows: rolls, window partitions, relative position bias) compiles as one graph
with no whole-graph failure and matches eager (issue 15; ConvNeXt is in test_integration_channels_last.py)."""

from __future__ import annotations

import torch

from kiln.integration import backend, explain


def test_hugging_face_swin_compiles_whole_and_matches_eager():
    import transformers  # a test dependency of kiln (kiln[test])

    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[1, 1],
                                     num_heads=[2, 2], window_size=4)
    model = transformers.SwinModel(config).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        report = explain(model, x)
        assert report.graph_count == 1 and report.eager_graphs == () and report.kernel_count > 0, str(report)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=lambda gm, ex: backend(gm, ex, options={"fallback": False}))
        torch.testing.assert_close(compiled(x).last_hidden_state, model(x).last_hidden_state, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
