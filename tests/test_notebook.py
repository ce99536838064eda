"""notebooks/demo_model_parallelism.ipynb: committed without outputs, runs end to end with small parameters."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

NOTEBOOK = REPO / "notebooks" / "demo_model_parallelism.ipynb"
SMALL = {
    "MODEL": "'resnet18'",
    "IMAGE_SIZE": "32",
    "BATCH_SIZE": "16",
    "MICRO_BATCHES": "[1, 2, 4]",
    "WARMUP": "1",
    "REPEATS": "2",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load():
    import nbformat

    return nbformat.read(str(NOTEBOOK), as_version=4)


def run_notebook(tmp_path: Path, parameters: dict, env: dict, timeout: int = 170):
    """Execute the notebook as papermill would: the parameters cell, then a cell setting the test's values."""
    import nbformat
    from nbclient import NotebookClient

    nb = load()
    values = {**SMALL, "OUTPUT_DIR": repr(str(tmp_path / "out")), **parameters}
    nb.cells.insert(1, nbformat.v4.new_code_cell("\n".join(f"{k} = {v}" for k, v in values.items()), metadata={"tags": ["injected-parameters"]}))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel inherits this environment
    try:
        start = time.monotonic()
        client.execute()
        elapsed = time.monotonic() - start
    finally:
        os.environ.clear()
        os.environ.update(saved)
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    images = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    return nb, text, images, elapsed


def test_notebook_is_committed_without_outputs():
    nb = load()
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
    first = nb.cells[0]
    assert first.cell_type == "code" and "parameters" in first.metadata.get("tags", [])
    for name in ("MODEL", "IMAGE_SIZE", "BATCH_SIZE", "MICRO_BATCHES", "SUBMIT", "SLURM_OVERRIDES"):
        assert re.search(rf"^{name} = ", first.source, flags=re.M), name
    source = "\n".join(cell.source for cell in code)
    # Only the public API: jobs through hpc_train.run/sweep, the timing cell through hpc_train.staged_model.
    for public in ("hpc_train.compose(", "hpc_train.staged_model(", "hpc_train.run(", "hpc_train.sweep("):
        assert public in source, public
    assert "hpc_train.compute" not in source and "hpc_train.cli" not in source


def test_notebook_runs_on_cpu(tmp_path):
    # CPU only, and no Slurm cluster reachable (even if the test cluster is up): the submit cell must skip.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", SLURM_CONF=str(tmp_path / "no-such-slurm.conf"))
    nb, text, images, elapsed = run_notebook(tmp_path, {}, env)
    assert elapsed < 180, f"the notebook took {elapsed:.0f} s"
    assert "No GPU found: ALL 2 stages run on the CPU" in text
    assert re.search(r"stage 0 on cpu: +\d+ layers", text) and re.search(r"stage 1 on cpu: +\d+ layers", text)
    for label in ("single device:", "model parallel, 2 stages:", "pipeline, 1 micro-batch:", "pipeline, 4 micro-batches:"):
        assert label in text, label
    png = tmp_path / "out" / "time_vs_micro_batches.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert len(images) == 1 and base64.b64decode(images[0]["data"]["image/png"])[:8] == PNG_MAGIC  # shown inline too
    # The Slurm part: the exact sbatch script of the pipeline job, then no submission.
    assert "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --gres=gpu:4" in text and "#SBATCH --nodes=1" in text
    assert "dry run, nothing submitted" in text and "pipeline: 1 node x 1 task/node" in text
    assert "No Slurm cluster answers here" in text and "nothing submitted" in text
    assert "No sweep was submitted from this notebook." in text


@pytest.mark.slurm
def test_notebook_submits_to_slurm_when_it_answers(slurm_cluster, tmp_path):
    overrides = ["cluster.cpus_per_gpu=1", "cluster.time=5", "resources.gpus_per_node=2", "trainer.max_steps=3", "trainer.epochs=null", "trainer.eval=false", "trainer.progress=false", "data.num_samples=64"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    nb, text, images, elapsed = run_notebook(tmp_path, {"SUBMIT": "True", "WAIT": "True", "SLURM_OVERRIDES": repr(overrides)}, env, timeout=400)
    sweep_dirs = list((tmp_path / "out" / "slurm_sweep").iterdir())
    assert len(sweep_dirs) == 1
    sweep = sweep_dirs[0]
    assert (sweep / "jobs.tsv").exists()
    for job in ("0", "1", "2"):
        assert (sweep / job / "summary.json").exists(), job
    rows = [line for line in text.splitlines() if re.match(r"^[012] +[\d_]+ +strategy\.chunks=[124] +pipeline ", line)]
    assert len(rows) == 3 and all("COMPLETED" in row for row in rows), text
    assert len(images) == 2  # the timing plot and the sweep report
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", ",".join(line.split("\t")[0] for line in (sweep / "jobs.tsv").read_text().splitlines()[1:])], capture_output=True, text=True)
    assert out.stdout.split() == ["COMPLETED"] * 3
