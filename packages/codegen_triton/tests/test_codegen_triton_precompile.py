"""Kernels compiled in threads right after codegen (`precompile.py`): `warmup` gets exactly the
launch the first call makes, with tensors given by their dtypes. Triton's JITFunction is a
stand-in here (the real warmup runs in the GPU-mode suite: KILN_TRITON_TEST_DEVICE=cuda)."""

import contextlib
import importlib.util
import pathlib

import pytest
import torch

from kiln.codegen_triton import TritonOptions
from kiln.codegen_triton._internal import precompile as precompile_module


def _launch_tests():
    """The stand-ins of test_codegen_triton_launch.py (tests run with --import-mode=importlib,
    where a test module cannot import its neighbour by name)."""
    path = pathlib.Path(__file__).with_name("test_codegen_triton_launch.py")
    spec = importlib.util.spec_from_file_location("codegen_triton_launch_stand_ins", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_LAUNCH = _launch_tests()
FakeJITFunction, fake_kernel, knobs = _LAUNCH.FakeJITFunction, _LAUNCH.fake_kernel, _LAUNCH.knobs  # knobs: a fixture

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on masked-off lanes


class WarmedJITFunction(FakeJITFunction):
    def __init__(self, real):
        super().__init__(real)
        self.warmups = []

    def warmup(self, *args, grid, **kwargs):
        self.warmups.append((args, grid, kwargs))

    def __getitem__(self, grid):
        run = super().__getitem__(grid)

        def recording(*args, **kwargs):
            self.log.append(("launch", (args, grid, kwargs)))
            return run(*args, **kwargs)

        return recording


@pytest.fixture
def cuda_stand_in(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())


def _warmed(fn, example, tmp_path, tracing_mode="real"):
    module, kernel, fake = fake_kernel(fn, example, TritonOptions(cache_dir=tmp_path), tracing_mode)
    warmed = WarmedJITFunction(fake.real)
    kernel.jit_function = warmed
    kernel._launcher.jit_function = warmed
    return module, kernel, warmed


@pytest.mark.parametrize("fn", [lambda x: x * 2 + 1, lambda x: (x * x).sum(-1).sqrt(),
                                lambda x: x.to(torch.bfloat16).sum(0)],
                         ids=["pointwise", "row", "bf16_sum0"])
def test_warmup_gets_the_first_launch(tmp_path, knobs, cuda_stand_in, fn):
    x = torch.randn(6, 40)
    module, kernel, warmed = _warmed(fn, x, tmp_path)
    assert precompile_module.precompile([kernel], threads=4) == 1
    ((args, grid, kwargs),) = warmed.warmups
    module(x)
    launches = [call for path, call in warmed.log if path == "launch"]
    (launched_args, launched_grid, launched_kwargs) = launches[0]
    assert [a.dtype if isinstance(a, torch.Tensor) else a for a in launched_args] == list(args)
    assert (launched_grid, launched_kwargs) == (grid, kwargs)


def test_kernels_with_size_symbols_compile_at_their_first_launch(tmp_path, knobs, cuda_stand_in):
    _, kernel, warmed = _warmed(lambda x: x + 1, torch.randn(8), tmp_path, tracing_mode="symbolic")
    assert kernel.kernel.symbols and not kernel.can_precompile()
    assert precompile_module.precompile([kernel], threads=4) == 0 and not warmed.warmups


def test_nothing_is_precompiled_without_threads_or_a_gpu(tmp_path, knobs, monkeypatch):
    _, kernel, warmed = _warmed(lambda x: x + 1, torch.randn(8), tmp_path)
    assert precompile_module.precompile([kernel], threads=1) == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precompile_module.precompile([kernel], threads=8) == 0 and not warmed.warmups
