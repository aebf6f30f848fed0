"""Python calls per call of a compiled graph: the wrapper's per-call work, counted (not timed).

Each graph's module runs under `sys.setprofile` for its second call; the counts are of Python
functions entered (C functions aside). The bounds are below what the wrapper made before its
input layout checks were one call, its mutated inputs' write-backs were kernel stores, the
tensors it saves for the backward were no copies and autograd_trace's runtime stopped
re-deriving its input layouts on every call (in brackets).
"""

import collections
import sys

import pytest
import torch

from kiln.integration import backend


class Profiled(torch.nn.Module):
    """A compiled graph's module, counting the Python functions each call enters, by name."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.calls = collections.Counter()

    def forward(self, *args):
        calls = collections.Counter()

        def profile(frame, event, arg):
            if event == "call":
                calls[frame.f_code.co_name] += 1

        sys.setprofile(profile)
        try:
            return self.module(*args)
        finally:
            sys.setprofile(None)
            self.calls = calls


def second_call_counts(model, x, grad):
    torch._dynamo.reset()
    modules = []

    def compiler(gm, example_inputs):
        modules.append(Profiled(backend(gm, example_inputs, options={"fallback": False, "codegen": "cpu"})))
        return modules[-1]

    compiled = torch.compile(model, backend=compiler)
    with torch.set_grad_enabled(grad):
        compiled(x)
        compiled(x)
    (module,) = modules
    return module.calls


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln = torch.nn.Linear(16, 32), torch.nn.LayerNorm(32)
        self.l2, self.l3 = torch.nn.Linear(32, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.nn.functional.gelu(self.ln(self.l1(x))))))


class BatchNormRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(x))


@pytest.mark.parametrize("case, bound", [
    ("mlp inference", 32),  # (38)
    ("mlp training", 90),  # (148)
    ("batch norm training", 95),  # (145)
    ("batch norm in train mode under no_grad", 40),  # (42)
])
def test_python_calls_per_graph_call(case, bound):
    torch.manual_seed(0)
    model = MLP() if case.startswith("mlp") else BatchNormRelu()
    x = torch.randn(4, 16) if case.startswith("mlp") else torch.randn(2, 8, 4, 4).to(memory_format=torch.channels_last)
    calls = second_call_counts(model, x.requires_grad_(case.endswith("training")), case.endswith("training"))
    assert calls["ensure_layout"] + calls["ensure_layouts"] == 1  # the inputs' layouts: one check
    # no copy of an output no user sees (batch norm's saved statistics), at most one view through
    # the dispatcher (an output's; none for the externs' operands outside grad mode, nor for
    # views nothing reads)
    assert calls["copied_view"] == 0 and calls["strided_view"] <= 1
    assert sum(calls.values()) <= bound, calls.most_common()
