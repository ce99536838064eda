"""The CLI under the real torchrun: one job in torchrun's world, one run dir, the same result as hpc-train.

Also a worker started alone for a job planned for 2 ranks (a batch step without srun): refused.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from tests.support.cli import TINY, assert_ok, read_summary, run_cli, run_python
from tests.support.paths import REPO

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
JOB = [*TINY, "strategy=ddp", "resources.gpus_per_node=2", "trainer.epochs=1", "seed=3"]


def quiet_env(**extra: str) -> Dict[str, str]:
    """CPU workers, one thread each (torchrun's default), no rank variables leaking in from outside."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_", "SUBMITIT_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", **extra)
    return env


def torchrun(options: List[str], args: List[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    command = [TORCHRUN, *options, "-m", "hpc_train.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=quiet_env())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The same job started the normal way: hpc-train and its local launcher."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert_ok(run_cli(JOB, run_dir, env=quiet_env()))
    return run_dir


def test_torchrun_runs_one_job_in_its_world_with_one_run_dir(reference, tmp_path):
    proc = torchrun(["--standalone", "--nproc_per_node=2"], JOB, cwd=tmp_path)
    assert_ok(proc)
    run_dirs = list((tmp_path / "outputs").iterdir())
    assert len(run_dirs) == 1 and run_dirs[0].name.startswith("torchrun-"), run_dirs  # not one dir per rank
    run_dir = run_dirs[0]
    summary = read_summary(run_dir)
    assert summary["world_size"] == 2 and summary["strategy"] == "ddp"
    assert summary["train_loss"] == pytest.approx(read_summary(reference)["train_loss"], rel=1e-6)
    assert (run_dir / "job_config.yaml").exists() and (run_dir / ".hydra" / "config.yaml").exists()
    assert sorted(p.name for p in (run_dir / "logs").glob("rank*.log")) == ["rank0.log", "rank1.log"]
    assert "started by torchrun" in (run_dir / "logs" / "rank1.log").read_text()
    assert proc.stdout.count("hpc-train: done:") == 1  # rank 0 reports, once


def test_torchrun_without_a_run_id_needs_hydra_run_dir(tmp_path):
    # A static rendezvous (here: an explicit --master-port) gives the run id "none": nothing to name a shared dir after.
    proc = torchrun(["--nproc_per_node=2", f"--master-port={free_port()}"], JOB, cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "torchrun" in proc.stderr and "hydra.run.dir=" in proc.stderr and "hpc-train directly" in proc.stderr, (
        proc.stderr
    )
    assert proc.stderr.count("invalid configuration for `hydra.run.dir`") == 1  # said once, not by every rank
    assert "hpc_train/" not in proc.stderr  # no traceback from our code (torchrun prints its own)
    assert not (tmp_path / "outputs").exists()


def test_torchrun_world_must_match_the_plan(tmp_path):
    proc = torchrun(
        ["--standalone", "--nproc_per_node=3"], [*JOB, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, timeout=120
    )
    assert proc.returncode != 0
    assert "`resources.gpus_per_node`" in proc.stderr and "--nproc_per_node=2" in proc.stderr, proc.stderr
    assert proc.stderr.count("invalid configuration for") == 1 and "hpc_train/" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "summary.json").exists() and not (tmp_path / "run" / "job_config.yaml").exists()


def test_worker_alone_for_a_job_planned_for_two_ranks_is_refused(reference, tmp_path):
    """A batch step that forgot srun runs one process: it must not train alone and exit 0."""
    spec = yaml.safe_load((reference / "job_config.yaml").read_text())
    assert spec["job"]["layout"]["world_size"] == 2
    spec["job"]["run_dir"] = str(tmp_path / "run")
    config = tmp_path / "job_config.yaml"
    config.write_text(yaml.safe_dump(spec))
    env = quiet_env(
        SLURM_JOB_ID="4242", SLURM_NTASKS="2", SLURM_PROCID="0", SLURM_JOB_NODELIST="localhost"
    )  # a batch script's own shell
    proc = subprocess.run(
        [sys.executable, "-m", "hpc_train.compute.worker", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    output = proc.stdout + proc.stderr
    assert "planned for 2 rank(s), but this process is rank 0 of 1" in output and "srun -n 2" in output, output
    assert "Traceback" not in output
    assert not (tmp_path / "run" / "summary.json").exists() and not (tmp_path / "run" / "checkpoints").exists()


def test_the_torchrun_client_and_host_lists_do_not_import_torch():
    code = (
        "import sys\nimport hpc_train.launch.backends.local.torchrun, hpc_train.slurm.hostlist, "
        "hpc_train.compute.runtime.ranks\nassert 'torch' not in sys.modules\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
