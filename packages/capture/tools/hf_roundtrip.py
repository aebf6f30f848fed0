"""Save / load round trip of every graph of the HF models in the capture tests, as a table.

    python packages/capture/tools/hf_roundtrip.py [--dynamic] [--report bert] [--html DIR]

Builds BERT, GPT-2, T5, Llama, ViT, ResNet and ConvNext from tiny configs with random
weights (nothing is downloaded), captures each with Dynamo, saves and loads every graph,
and checks that the loaded graph gives bit-identical outputs. ``--report NAME`` prints that
model's capture report; ``--html DIR`` writes every model's HTML page. Needs transformers.
Exit status 1 if any graph does not round-trip.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import torch

from kiln.capture import load, save, verify

TESTS = Path(__file__).resolve().parents[1] / "tests" / "test_capture_hf_models.py"


def model_table():
    """The test module's model table and helpers (one source of truth for the configs)."""
    spec = importlib.util.spec_from_file_location("capture_hf_models", TESTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def round_trip(models, name: str, dynamic: bool, directory: Path) -> tuple[list[str], object]:
    start = time.perf_counter()
    _, _, result = models.capture_model(name, dynamic=dynamic or None)
    capture_s = time.perf_counter() - start
    identical, size, save_s, load_s = True, 0, 0.0, 0.0
    for graph in result.graphs:
        path = directory / f"{name}_{graph.index}.kcg"
        start = time.perf_counter()
        save(graph, path)
        save_s += time.perf_counter() - start
        start = time.perf_counter()
        loaded = load(path)
        load_s += time.perf_counter() - start
        verify(loaded)
        size += path.stat().st_size
        inputs = [_concrete(v) for v in graph.example_inputs]
        with torch.no_grad():
            expected = models.flat_tensors(graph.gm(*inputs))
            actual = models.flat_tensors(loaded.gm(*loaded.example_inputs))
        identical &= len(actual) == len(expected) and all(
            torch.equal(a, e) for a, e in zip(actual, expected)
        )
    ops = sum(graph.num_ops for graph in result.graphs)
    row = [name, str(len(result.graphs)), str(ops), str(len(result.breaks)),
           f"{size / 1024:.0f} KiB", f"{capture_s:.2f}", f"{save_s:.2f}", f"{load_s:.2f}",
           "yes" if identical else "NO"]  # fmt: skip
    return row, result


def _concrete(value):
    return int(value.node.hint) if isinstance(value, torch.SymInt) else value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dynamic", action="store_true", help="capture with dynamic=True")
    parser.add_argument("--report", metavar="NAME", help="print this model's capture report")
    parser.add_argument("--html", metavar="DIR", help="write each model's HTML page here")
    options = parser.parse_args()
    models = model_table()
    header = ["model", "graphs", "ops", "breaks", "file", "capture s", "save s", "load s",
              "identical"]  # fmt: skip
    rows, failed = [header], False
    with tempfile.TemporaryDirectory() as scratch:
        for name in models.MODELS:
            row, result = round_trip(models, name, options.dynamic, Path(scratch))
            rows.append(row)
            failed |= row[-1] != "yes"
            if options.html:
                result.to_html(Path(options.html) / f"{name}.html")
            if name == options.report:
                report = result.report()
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    print(f"torch {torch.__version__}, dynamic={options.dynamic}")
    if options.report:
        print(f"\n{report}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
