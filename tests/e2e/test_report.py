"""`hpc-train-report`: the table and PNG of real local runs and sweeps (of Slurm jobs:
tests/slurm/test_report_on_slurm.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from tests.support.cli import TINY, assert_ok, read_summary, run_cli, run_python
from tests.support.paths import REPO

REPORT_BIN = Path(sys.executable).parent / "hpc-train-report"  # the installed console script
TRAIN = [*TINY, "trainer.max_steps=12", "trainer.epochs=null", "trainer.batch_size=32", "trainer.log_every=3"]
SWEEP = "strategy=single,ddp,model_parallel"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def report(*args: str, env: Dict[str, str] = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPORT_BIN), *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)


def table(stdout: str) -> List[Dict[str, str]]:
    """The printed table as dicts (header line, dashes, rows; cells are separated by 2+ spaces)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("job "))
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = []
    for line in lines[start + 2 :]:
        if not line.strip() or line.startswith("("):
            break
        rows.append(dict(zip(header, re.split(r"\s{2,}", line.strip()))))
    return rows


def png_size(path: Path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def check_against_summaries(stdout: str, sweep_dir: Path, strategies: List[str]) -> None:
    rows = table(stdout)
    assert [r["job"] for r in rows] == [str(i) for i in range(len(strategies))]
    for row, strategy in zip(rows, strategies):
        summary = read_summary(sweep_dir / row["job"])
        assert row["overrides"] == f"strategy={strategy}"
        assert row["strategy"] == summary["strategy"] == strategy
        assert row["status"] == "COMPLETED"
        assert int(row["world"]) == summary["world_size"]
        assert row["samples/s"] == f"{summary['samples_per_sec']:.1f}"
        assert row["train loss"] == f"{summary['train_loss']:.4f}"
        assert row["eval acc"] == f"{summary['eval_accuracy']:.4f}"
        assert row["attempts"] == str(summary.get("attempts", 1))
    assert "overrides shared by every job: " in stdout and "trainer.max_steps=12" in stdout


def check_json(sweep_dir: Path) -> None:
    proc = report(str(sweep_dir), "--json", "--no-png")
    assert_ok(proc)
    rows = json.loads(proc.stdout)
    for row in rows:
        summary = read_summary(sweep_dir / row["name"])
        assert row["samples_per_sec"] == summary["samples_per_sec"]
        assert row["train_loss"] == summary["train_loss"]
        assert row["eval_accuracy"] == summary["eval_accuracy"]
        metrics = [json.loads(line) for line in (sweep_dir / row["name"] / "metrics.jsonl").read_text().splitlines()]
        assert row["loss_curve"] == [[m["step"], m["loss"]] for m in metrics if m["kind"] == "train"]
        assert row["loss_curve"][-1] == [12, summary["train_loss"]]


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("report") / "sweep"
    proc = run_cli(["-m", *TRAIN, SWEEP, f"hydra.sweep.dir={sweep_dir}"], timeout=400)
    assert_ok(proc)
    return sweep_dir


def test_report_of_a_local_sweep(local_sweep):
    proc = report(str(local_sweep))
    assert_ok(proc)
    check_against_summaries(proc.stdout, local_sweep, ["single", "ddp", "model_parallel"])
    width, height = png_size(local_sweep / "report.png")
    assert width >= 1000 and height >= 500
    assert f"plot written to {local_sweep / 'report.png'}" in proc.stdout
    check_json(local_sweep)


def test_report_of_one_run_dir(local_sweep, tmp_path):
    run_dir = local_sweep / "1"
    png = tmp_path / "one.png"
    proc = report(str(run_dir), "--png", str(png))
    assert_ok(proc)
    [row] = table(proc.stdout)
    summary = read_summary(run_dir)
    assert row["strategy"] == "ddp" and row["layout"] == "1x2x1" and row["world"] == "2"
    assert row["samples/s"] == f"{summary['samples_per_sec']:.1f}"
    assert "strategy=ddp" in row["overrides"] and "trainer.max_steps=12" in row["overrides"]
    png_size(png)


def test_report_without_matplotlib_prints_the_table_and_the_fix(local_sweep, tmp_path):
    # A real interpreter on which `import matplotlib` fails, as on a bare login node.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    env = dict(os.environ, PYTHONPATH=str(shim))
    png = tmp_path / "never.png"
    proc = report(str(local_sweep), "--png", str(png), env=env)
    assert_ok(proc)
    assert len(table(proc.stdout)) == 3
    assert "matplotlib is not installed" in proc.stderr and "pip install 'hpc-train[report]'" in proc.stderr
    assert not png.exists()


def test_report_refuses_a_folder_without_runs(tmp_path):
    proc = report(str(tmp_path))
    assert proc.returncode == 2
    assert "holds no run" in proc.stderr and "Traceback" not in proc.stderr
    proc = report(str(tmp_path / "missing"))
    assert proc.returncode == 2 and "is not a folder" in proc.stderr


def test_report_does_not_import_torch():
    code = (
        "import sys, hpc_train.report.command\nheavy = [m for m in ('torch', 'numpy') if m in sys.modules]\nassert "
        "not heavy, heavy\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
