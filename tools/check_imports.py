"""Checks the dependency rules of ../shared/ARCHITECTURE.md on package source code.

1. A package imports only the kiln packages its pyproject.toml declares (and itself).
2. Package code does not use the anchors kiln competes with (tests and benchmarks may).
Exit status 1 with one line per violation.
"""

from __future__ import annotations

import ast
import pathlib
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORBIDDEN = (
    "torch._inductor",
    "torch._functorch.aot_autograd",
    "torch._functorch.partitioners",
    "torch.fx.passes.infra.partitioner",
    "torch.fx.subgraph_rewriter",
)


def projects() -> dict[str, pathlib.Path]:
    found = {p.name: p for p in sorted((ROOT / "packages").iterdir()) if (p / "pyproject.toml").exists()}
    found["integration"] = ROOT / "integration"
    return found


def declared(project: pathlib.Path) -> set[str]:
    deps = tomllib.loads((project / "pyproject.toml").read_text())["project"].get("dependencies", [])
    return {d.split()[0].removeprefix("kiln-").replace("-", "_") for d in deps if d.startswith("kiln-")}


def imported_modules(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def check() -> list[str]:
    errors = []
    for name, project in projects().items():
        allowed = declared(project) | {name}
        for path in sorted((project / "src").rglob("*.py")):
            rel = path.relative_to(ROOT)
            for lineno, module in imported_modules(path):
                parts = module.split(".")
                if parts[0] == "kiln" and len(parts) > 1 and parts[1] not in allowed:
                    errors.append(f"{rel}:{lineno}: imports kiln.{parts[1]}, which {name} does not declare")
                if any(module == f or module.startswith(f + ".") for f in FORBIDDEN):
                    errors.append(f"{rel}:{lineno}: package code may not use {module}")
        if (project / "src" / "kiln" / "__init__.py").exists():
            errors.append(f"{project.relative_to(ROOT)}: src/kiln/__init__.py breaks the PEP 420 namespace")
    return errors


if __name__ == "__main__":
    problems = check()
    print("\n".join(problems) if problems else "imports: every package imports only what it declares")
    sys.exit(1 if problems else 0)
