"""The README examples run as written."""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def run_block(index: int) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 2
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[index], str(README), "exec"), {})
    return printed.getvalue()


def test_readme_example_runs_and_prints_aten_code() -> None:
    code = run_block(0)
    assert "torch.ops.aten.mm.default" in code
    assert "silu" not in code


def test_readme_training_example_runs_and_prints_the_partition() -> None:
    printed = run_block(1)
    assert "Partition[min_cut" in printed
    assert "torch.Size([32, 8])" in printed
