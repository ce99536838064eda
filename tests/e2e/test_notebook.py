"""notebooks/demo_model_parallelism.ipynb runs end to end (committed without outputs:
tests/unit/test_notebook_without_outputs.py).

Without a GPU, with its DEFAULT parameters, within a stated time (it scales its timing down by
itself); its Slurm cells size the request from what `sinfo` says the partition offers (a stand-in
`sinfo` for 8-CPU nodes here, the real test cluster in the slurm tests) and never queue a job the
partition cannot run.
"""

from __future__ import annotations

import base64
import os
import re
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from tests.unit.test_notebook_without_outputs import load

SMALL = {
    "MODEL": "'resnet18'",
    "IMAGE_SIZE": "32",
    "BATCH_SIZE": "16",
    "MICRO_BATCHES": "[1, 2, 4]",
    "WARMUP": "1",
    "REPEATS": "2",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# What a whole GPU-less run of the defaults may take on 2 cores (README, "Notebook"): the timing
# scales itself down to CPU_BUDGET_S = 60 s; kernel start, imports and the dry run add the rest. The test checks the
# part the notebook controls, its timing against its budget; the kernel's wait is a guard against a hang only (three
# times the budget: kernel start and imports on a loaded machine are not what is tested).
DEFAULT_RUN_BUDGET_S = 120

# A stand-in `sinfo` (and `sbatch`/`squeue`/`scancel` that refuse): nodes from $FAKE_SINFO_NODES,
# "node|partition|CPUs|S:C:T|memory MB|gres|time limit" separated by ";", printed in the -o format
# asked for (the notebook's and the launcher's capacity check's); without it sinfo fails at once,
# as on a front end whose cluster does not answer (a missing SLURM_CONF makes the real one retry for 60 s).
FAKE_SINFO = r"""#!/usr/bin/env python3
import os, re, sys
nodes = os.environ.get("FAKE_SINFO_NODES")
if not nodes:
    sys.exit("sinfo: error: Unable to contact slurm controller (connect failure)")
fmt = sys.argv[sys.argv.index("-o") + 1] if "-o" in sys.argv else "%P|%N"
for spec in nodes.split(";"):
    values = dict(zip("NPczmGl", spec.split("|")))
    print(re.sub(r"%(\w)", lambda m: values.get(m.group(1), ""), fmt))
"""
REFUSE = '#!/bin/sh\necho "$(basename "$0"): error: this test has no Slurm cluster" >&2\nexit 1\n'


def fake_slurm(tmp_path: Path, nodes: Optional[List[str]] = None) -> Dict[str, str]:
    """The environment of a CPU-only front end whose Slurm commands are the stand-ins above."""
    bin_dir = tmp_path / "fake-slurm-bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (
        ("sinfo", FAKE_SINFO),
        ("sbatch", REFUSE),
        ("squeue", REFUSE),
        ("scancel", REFUSE),
        ("sacct", REFUSE),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env.pop("FAKE_SINFO_NODES", None)
    if nodes:
        env["FAKE_SINFO_NODES"] = ";".join(nodes)
    return env


def slurm_cells(nb) -> List:
    """The setup cell (imports, out_dir) and every code cell from the Slurm sizing cell on: the Slurm part without the
    timing."""
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    setup = next(i for i, cell in enumerate(code) if "model_cfg = hpc_train.compose(" in cell.source)
    sizing = next(i for i, cell in enumerate(code) if "def sinfo_nodes(" in cell.source)
    return [code[0], code[setup], *code[sizing:]]


def run_notebook(tmp_path: Path, parameters: dict, env: dict, timeout: int = 170, cells: Optional[Callable] = None):
    """Execute the notebook as papermill would: the parameters cell, then a cell setting the test's values."""
    import nbformat
    from nbclient import NotebookClient

    nb = load()
    if cells is not None:
        nb.cells = cells(nb)
    values = {"OUTPUT_DIR": repr(str(tmp_path / "out")), **parameters}
    nb.cells.insert(
        1,
        nbformat.v4.new_code_cell(
            "\n".join(f"{k} = {v}" for k, v in values.items()), metadata={"tags": ["injected-parameters"]}
        ),
    )
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


def test_notebook_defaults_on_cpu_scale_down_and_finish_in_time(tmp_path):
    # The DEFAULT parameters (ResNet-50, 128 px, batch 64, micro-batches up to 16), no GPU, no
    # Slurm answering: the notebook scales its timing down itself, says so, and ends in time.
    nb, text, images, _ = run_notebook(tmp_path, {}, fake_slurm(tmp_path), timeout=3 * DEFAULT_RUN_BUDGET_S)
    assert "No GPU found: ALL 2 stages run on the CPU" in text
    assert (
        "Scaled down for the CPU (CPU_SCALE_DOWN = True): image size 128 -> 64, warm-up passes 2 -> 1, timed passes "
        "5 -> 3;" in text
    )
    assert "the 7 measurements share CPU_BUDGET_S = 60 s" in text and "took about 7.5 minutes on 2 cores" in text
    assert (
        "model resnet50, batch 64 x 3 x 64 x 64, 2 stages, micro-batches [1, 2, 4, 8, 16], 1 warm-up + 3 timed "
        "passes per point" in text
    )
    assert re.search(r"stage 0 on cpu: +\d+ layers", text) and re.search(r"stage 1 on cpu: +\d+ layers", text)
    for label in (
        "single device:",
        "model parallel, 2 stages:",
        "pipeline, 1 micro-batch:",
        "pipeline, 4 micro-batches:",
        "pipeline, 16 micro-batches:",
    ):
        assert label in text, label
    timing = float(re.search(r"timing took (\d+) s", text).group(1))
    # The budget, plus what it cannot cut: each of the 7 measurements runs its warm-up and one timed pass whatever
    # its share (on a loaded machine those alone can pass 60 s), so at most two passes of each over the budget.
    forced = sum(2 * float(ms) / 1000 for ms in re.findall(r"([\d.]+) ms per batch", text))
    assert timing <= 60 + forced + 5, text
    png = tmp_path / "out" / "time_vs_micro_batches.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert len(images) == 1 and base64.b64decode(images[0]["data"]["image/png"])[:8] == PNG_MAGIC  # shown inline too
    # The Slurm part: the profile's request unchanged, the exact sbatch script of the pipeline job, then no submission.
    assert (
        "No Slurm cluster answers here: the request stays the profile's, 1 node(s) x 4 GPUs and 4 x 4 = 16 CPUs per "
        "task" in text
    )
    assert (
        "#SBATCH --ntasks-per-node=1" in text
        and "#SBATCH --gres=gpu:4" in text
        and "#SBATCH --nodes=1" in text
        and "#SBATCH --cpus-per-task=16" in text
    )
    assert "dry run, nothing submitted" in text and "pipeline: 1 node x 1 task/node" in text
    assert "No Slurm cluster answers here (`sinfo` is missing or fails): nothing submitted." in text
    assert "No sweep was submitted from this notebook." in text


def node(name: str, partition: str, cpus: int, gres: str) -> str:
    return f"{name}|{partition}|{cpus}|1:{cpus}:1|8000|{gres}|infinite"


def test_notebook_sizes_the_slurm_request_to_the_partition(tmp_path):
    # A cluster of 8-CPU nodes with 4 GPUs, where the generic profile asks 4 CPUs x 4 GPUs = 16.
    nodes = [node(n, p, 8, "gpu:4") for n in ("hpcnode1", "hpcnode2") for p in ("debug*", "gpu_p2")]
    _, text, _, _ = run_notebook(tmp_path, {**SMALL, "SUBMIT": "False"}, fake_slurm(tmp_path, nodes), cells=slurm_cells)
    assert (
        "cluster.cpus_per_gpu=4 would ask for 16 CPUs per task, but the nodes of partition debug (the default) have "
        "8: lowered to 2 (8 CPUs / 4 GPUs)." in text
    )
    assert "partition debug (the default): 2 node(s) with 8 CPUs and 4 GPUs each (sinfo)." in text
    assert "The request: 1 node(s) x 4 GPUs, 2 x 4 = 8 CPUs per task: fits." in text
    assert "resources.gpus_per_node=4 cluster.cpus_per_gpu=2 strategy.chunks=4 dry_run=true" in text
    assert (
        "#SBATCH --cpus-per-task=8" in text and "#SBATCH --gres=gpu:4" in text
    )  # the launcher (reading the same sinfo) accepts it
    assert "SUBMIT = False: nothing submitted." in text


def test_notebook_never_submits_what_the_partition_cannot_hold(tmp_path):
    # Nodes with 8 CPUs and 2 GPUs: 4 GPUs are capped to 2; an explicit SLURM_CPUS_PER_GPU = 8 (16 CPUs) is not
    # lowered, so nothing is queued.
    nodes = [node(n, "gpu_p2", 8, "gpu:2") for n in ("hpcnode1", "hpcnode2")] + [node("cpu1", "cpu*", 64, "(null)")]
    params = {
        **SMALL,
        "SUBMIT": "True",
        "SLURM_CPUS_PER_GPU": "8",
        "SLURM_OVERRIDES": repr(["cluster.partition=gpu_p2", "resources.gpus_per_node=4"]),
    }
    _, text, _, _ = run_notebook(tmp_path, params, fake_slurm(tmp_path, nodes), cells=slurm_cells)
    assert "resources.gpus_per_node=4 is more than a node of partition gpu_p2 has: asking for 2." in text
    assert (
        "The request: 1 node(s) x 2 GPUs, 8 x 2 = 16 CPUs per task: does NOT fit (SLURM_CPUS_PER_GPU = 8): nothing "
        "will be submitted." in text
    )
    assert (
        "hpc-train refuses this request (its message above): nothing would be queued." in text
        and "invalid configuration for `cluster.cpus_per_gpu`" in text
    )  # the launcher's own check
    assert "The partition cannot hold this request (see the sizing cell above): nothing submitted." in text
    assert not (tmp_path / "out" / "slurm_sweep").exists() or not any(
        (tmp_path / "out" / "slurm_sweep").rglob("jobs.tsv")
    )
    # A partition without GPUs: said, and nothing submitted.
    params["SLURM_OVERRIDES"] = repr(["cluster.partition=cpu"])
    _, text, _, _ = run_notebook(tmp_path, params, fake_slurm(tmp_path, nodes), cells=slurm_cells)
    assert "The nodes of partition cpu have no GPUs, and a pipeline job needs them: nothing will be submitted" in text
    assert "The partition cannot hold this request" in text
