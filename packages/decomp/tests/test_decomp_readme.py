"""The README example runs as written."""

import re
from pathlib import Path


def test_readme_example_runs():
    readme = Path(__file__).resolve().parents[1] / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    assert blocks, "README.md has no python example"
    exec(compile(blocks[0], str(readme), "exec"), {"__name__": "readme_example"})
