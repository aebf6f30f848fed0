"""The OpInfo differential sweep (tools/opinfo_decomp.py) on a deterministic subset of op_db:
the ops kiln writes decompositions for, forward and gradients, float32 and float64, the
first samples of each. The whole op_db runs with ``python tools/opinfo_decomp.py``."""

import importlib.util
import sys
from functools import cache
from pathlib import Path

import pytest

pytest.importorskip("expecttest", reason="torch's op_db needs expecttest (pip install expecttest)")

TOOL = Path(__file__).resolve().parents[1] / "tools" / "opinfo_decomp.py"

# op_db names whose samples reach kiln's own decompositions (and a few of torch's)
SUBSET = [
    "softmax", "log_softmax", "nn.functional.softmin", "nn.functional.gelu",
    "nn.functional.silu", "nn.functional.hardswish", "nn.functional.layer_norm",
    "nn.functional.group_norm", "nn.functional.instance_norm", "nn.functional.batch_norm",
    "nn.functional.linear", "nn.functional.embedding", "nn.functional.nll_loss",
    "nn.functional.cross_entropy", "addbmm", "var_mean", "var", "clamp", "full_like",
    "matmul", "nn.functional.mish", "nn.functional.elu",
]  # fmt: skip

# Ops whose graphs keep a non-loop-level op for some sample, and why.
NOT_REDUCED = {
    # native_batch_norm in training writes its running-statistics arguments; functorch's
    # functionalize does not see that (kiln's autograd_trace rewrites F.batch_norm first)
    "nn.functional.batch_norm": "training native_batch_norm mutates its running stats",
    "nn.functional.instance_norm": "training native_batch_norm mutates its running stats",
    # max_norm samples renormalise the weight in place: a real mutation of an input
    "nn.functional.embedding": "embedding_renorm_ mutates the weight",
}

MAX_SAMPLES = 4


def _tool():
    spec = importlib.util.spec_from_file_location("kiln_opinfo_decomp", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


opinfo_decomp = _tool()


@cache
def _results(name):
    config = opinfo_decomp.SweepConfig(tables=("loop_level",), max_samples=MAX_SAMPLES)
    return tuple(opinfo_decomp.run_sweep([name], config))


@pytest.mark.parametrize("name", SUBSET)
def test_decompositions_match_eager(name):
    for result in _results(name):
        assert result.failed == 0, "\n".join(result.failures)
        assert result.passed > 0, f"{result.name}: no sample reached a decomposition"
        assert not opinfo_decomp.strict_xfail_errors([result])
        if name in NOT_REDUCED:
            continue
        assert result.is_reduced, f"{result.name} leaves {dict(result.leftover)}"


def test_the_subset_exercises_the_kiln_decompositions():
    decomposed = set()
    for name in SUBSET:
        for result in _results(name):
            decomposed |= result.decomposed_ops
    expected = {
        "aten._softmax.default", "aten._log_softmax.default", "aten._softmax_backward_data.default",
        "aten._log_softmax_backward_data.default", "aten.gelu.default", "aten.gelu_backward.default",
        "aten.silu.default", "aten.silu_backward.default", "aten.hardswish.default",
        "aten.hardswish_backward.default", "aten.native_layer_norm.default",
        "aten.native_layer_norm_backward.default", "aten.native_group_norm.default",
        "aten.native_group_norm_backward.default", "aten.native_batch_norm_backward.default",
        "aten.embedding.default", "aten.embedding_dense_backward.default",
        "aten.nll_loss_forward.default", "aten.nll_loss_backward.default",
        "aten.addbmm.default", "aten.var_mean.correction", "aten.clamp.Tensor",
    }  # fmt: skip
    assert expected <= decomposed, sorted(expected - decomposed)


def test_compare_follows_torch_tolerances():
    import torch

    compare = opinfo_decomp.compare
    x = torch.tensor([1.0, 2.0])
    assert compare(x, x.clone(), None) is None
    assert compare(x + 1e-3, x, None) is not None
    assert compare(x.double(), x, None) is not None  # dtype matters
    nan = torch.tensor([float("nan")])
    assert compare(nan, nan.clone(), None) is None
    # float32 may be as far from the float64 reference as eager is
    ref = torch.tensor([1.0], dtype=torch.float64)
    eager = torch.tensor([1.001])
    assert compare(torch.tensor([0.999]), eager, ref) is None
    assert compare(torch.tensor([0.99]), eager, ref) is not None
    # outputs of uninitialized memory (empty_like...): dtypes and shapes only
    assert compare(x + 5, x, None, values=False) is None
    assert compare(x[:1], x, None, values=False) is not None
    assert compare(x.double(), x, None, values=False) is not None
