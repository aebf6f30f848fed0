import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kiln.capture
from kiln.capture import load
from kiln.capture._internal.cli import main, parse_args

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch

    def step(x):
        y = torch.relu(x) * 2
        print("kiln-capture-cli-test:", sys.argv[1:])
        return y.sum()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, x):
            return torch.sigmoid(self.linear(x))

    torch.manual_seed(0)
    compiled = torch.compile(step, backend=BACKEND)
    compiled(torch.randn(3))
    compiled(torch.randn(3, dtype=torch.float64))
    net = Net()
    net.compile(backend=BACKEND)
    net(torch.randn(2, 4))
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    """
)


def write_script(tmp_path: Path, backend: str = '"eager"') -> Path:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("BACKEND", backend), encoding="utf-8")
    return script


def test_cli_writes_graphs_report_and_page(tmp_path, capsys):
    script = write_script(tmp_path)
    out = tmp_path / "out"
    status = main([str(script), "0", "--out", str(out)])
    assert status == 0
    assert "kiln-capture-cli-test: ['0']" in capsys.readouterr().out
    report = (out / "report.txt").read_text(encoding="utf-8")
    assert report.startswith("kiln.capture report: train.py (mode=dynamo)\n")
    assert "5 graphs, 1 graph break, 2 recompiles" in report
    assert f"at {script}:7 in step\n" in report  # the print line
    assert "dtype mismatch" in report and "script: " in report
    assert "<div class='card break' id='break-1'>" in (out / "report.html").read_text(
        encoding="utf-8"
    )
    saved = sorted((out / "graphs").glob("graph_*.kcg"))
    assert [p.name for p in saved] == [f"graph_{i:03d}.kcg" for i in range(5)]
    assert "def forward" in (out / "graphs" / "graph_004.py").read_text(encoding="utf-8")
    module_graph = load(saved[4])
    torch.manual_seed(0)
    (out_tensor,) = module_graph.gm(*module_graph.example_inputs)
    assert out_tensor.shape == (2, 2) and module_graph.op_counts()["torch.sigmoid"] == 1


def test_cli_returns_the_scripts_exit_status_and_keeps_its_backend(tmp_path):
    (tmp_path / "kiln_cli_test_backends.py").write_text(
        "CALLS = []\n"
        "def counting(gm, example_inputs):\n"
        "    CALLS.append(gm)\n"
        "    return gm.forward\n"
    )
    script = write_script(tmp_path, backend="counting")
    script.write_text("from kiln_cli_test_backends import counting\n" + script.read_text())
    out = tmp_path / "out"
    try:
        status = main(["--out", str(out), str(script), "3"])
        calls = sys.modules["kiln_cli_test_backends"].CALLS
    finally:
        sys.modules.pop("kiln_cli_test_backends", None)
    assert status == 3
    assert len(calls) == 5, "the script's own backend still compiles every graph"
    assert "exited with status 3" in (out / "report.txt").read_text(encoding="utf-8")


def test_out_may_follow_the_script_arguments():
    options = parse_args([__file__, "--lr", "0.1", "--out", "d"])
    assert (options.script, options.args, options.out) == (__file__, ["--lr", "0.1"], "d")
    options = parse_args([__file__, "--lr", "0.1", "--out=d"])
    assert (options.args, options.out) == (["--lr", "0.1"], "d")
    options = parse_args(["--out", "d", __file__, "--", "--out", "theirs"])
    assert (options.args, options.out) == (["--out", "theirs"], "d")
    with pytest.raises(SystemExit):
        parse_args([__file__, "x"])  # no --out


def test_python_dash_m_runs_the_command_line(tmp_path):
    script = write_script(tmp_path)
    out = tmp_path / "out"
    src = str(Path(kiln.capture.__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    completed = subprocess.run(
        [sys.executable, "-m", "kiln.capture", "--eager", str(script), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "5 graphs, 1 breaks, 2 recompiles" in completed.stderr
    assert (out / "report.html").is_file() and len(list((out / "graphs").glob("*.kcg"))) == 5


def test_script_that_compiles_nothing_still_gets_a_report(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import torch\nprint(torch.ones(2).sum())\n", encoding="utf-8")
    assert main([str(script), "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.txt").read_text(encoding="utf-8")
    assert "0 graphs, 0 graph breaks" in report and "no graph was captured" in report
    assert (tmp_path / "out" / "report.html").is_file()


def test_a_graph_that_cannot_be_saved_is_reported_not_raised(tmp_path):
    from kiln.capture import CapturedGraph
    from kiln.capture._internal.cli import GraphWriter

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(lambda t: t * 2, (x,), name="doubled"))
    record = CapturedGraph(torch.fx.GraphModule(torch.nn.Module(), graph), (torch.ones(1),))
    writer = GraphWriter(tmp_path / "graphs")
    writer(record)
    assert writer.saved == [] and len(writer.failures) == 1
    assert "graph 0: GraphFileError: cannot save node 'doubled'" in writer.failure_lines()
    assert (tmp_path / "graphs" / "graph_000.py").is_file()
