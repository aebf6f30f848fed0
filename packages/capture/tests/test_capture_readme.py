import re
import runpy
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(tmp_path, monkeypatch, capsys):
    """The first Python block of the README runs with torch and kiln-capture alone."""
    example = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)[0]
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    namespace = runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "2 graphs, 1 graph break" in out and f"at {script}:6 in f" in out
    assert "dtype mismatch" in out
    assert (tmp_path / "capture.html").is_file() and (tmp_path / "graph0.kcg").is_file()
    assert isinstance(namespace["loaded"].gm, torch.fx.GraphModule)
