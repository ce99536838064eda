"""Shared helpers: run the real `hpc-train` CLI in a subprocess and read what it wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

if TYPE_CHECKING:
    import torch

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO  # what the install puts on sys.path (the checkout: flat layout)

# A tiny, fast job: toy MLP on 8x8 synthetic images, no eval, no progress bar.
TINY_TRAINER = [
    "model=toy_mlp",
    "trainer.progress=false",
    "trainer.lr_schedule=constant",
    "trainer.lr=0.1",
    "trainer.weight_decay=0",
]
TINY_DATA = ["data=synthetic", "data.image_size=8", "data.num_samples=512", "data.val_samples=64"]
TINY = TINY_TRAINER + TINY_DATA


def run_cli(args: List[str], run_dir: Optional[Path] = None, timeout: float = 300, env: Optional[Dict[str, str]] = None, gpus: bool = False, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    """Run `hpc-train ARGS` as a user would; returns the finished process (stdout+stderr as text).

    Tests are CPU tests (gloo workers) unless they pass gpus=True: GPUs are hidden otherwise, so
    the same assertions hold on a GPU machine.
    """
    env = dict(os.environ if env is None else env)
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    command = [sys.executable, "-m", "hpc_train.cli", *args]
    if run_dir is not None:
        command.append(f"hydra.run.dir={run_dir}")
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO, env=env)


def final_weights(run_dir: Path) -> Dict[str, "torch.Tensor"]:
    import torch

    return torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)


def assert_bit_identical(a: Path, b: Path) -> None:
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert wa[name].equal(wb[name]), f"{name} differs after resume"


def checkpoint_steps(run_dir: Path) -> List[int]:
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(p.name[5:14]) for p in folder.glob("step_*"))  # step_<N>.ckpt files, fsdp's step_<N>/ dirs


def start_background(args: List[str], run_dir: Path, extra_env: Dict[str, str], stderr=subprocess.DEVNULL, cwd: Optional[Path] = None) -> subprocess.Popen:
    """`hpc-train ARGS` in its own process group (so kill_group reaches the launcher and every rank)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", **extra_env)
    return subprocess.Popen(
        [sys.executable, "-m", "hpc_train.cli", *args, f"hydra.run.dir={run_dir}"],
        cwd=cwd or REPO, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
    )


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank, no chance to clean up
    proc.wait(timeout=30)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def kill9_after_checkpoints(args: List[str], run_dir: Path, count: int = 2, cwd: Optional[Path] = None, step_sleep: float = 0.15) -> int:
    """Start a run, kill -9 its whole process group once `count` checkpoints exist; the newest checkpoint's step."""
    proc = start_background(args, run_dir, {"HPC_TRAIN_STEP_SLEEP": str(step_sleep)}, cwd=cwd)
    try:
        wait_for(lambda: len(checkpoint_steps(run_dir)) >= count, 180, f"{count} checkpoints")
    finally:
        kill_group(proc)
    return checkpoint_steps(run_dir)[-1]


def read_summary(run_dir: Path) -> Dict:
    return json.loads((run_dir / "summary.json").read_text())


def run_python(code: str, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """`python -c CODE` in a fresh interpreter from the repository root (what a fresh process imports)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"


@pytest.fixture
def cli():
    return run_cli


# -- the real Slurm test cluster -------------------------------------------------------------
import fcntl
import re
import shutil

CLUSTER_SCRIPT = REPO / "scripts" / "slurm_test_cluster.sh"


# The 16-node cluster of `start --nodes 16` (see the script's header, NODES): two name prefixes, so
# host lists compress to two ranges; partitions debug, gpu_p2, short (all nodes), hpc and gpu_a.
SCALE_NODES = 16
SCALE_NODELIST = "gpu-a[1-8],hpcnode[01-08]"  # as Slurm writes it (sorted by name)
SCALE_PARTITIONS = {"hpc": "hpcnode[01-08]", "gpu_a": "gpu-a[1-8]"}


def start_slurm_cluster(*options: str) -> None:
    """`slurm_test_cluster.sh start [OPTIONS]` (a no-op when it already runs so), then point SLURM_CONF at it.

    In CI a cluster that does not come up fails the tests; elsewhere (no root, say) they skip.
    """
    proc = subprocess.run(["bash", str(CLUSTER_SCRIPT), "start", *options], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        message = f"the Slurm test cluster did not start:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        if os.environ.get("CI") == "true" or os.geteuid() == 0:
            pytest.fail(message)
        pytest.skip(message)
    env = subprocess.run(["bash", str(CLUSTER_SCRIPT), "env"], capture_output=True, text=True, check=True).stdout
    for key, value in re.findall(r"^export (\w+)=(\S+)$", env, flags=re.M):
        os.environ[key] = value.strip("'\"")  # every sbatch/scontrol the tests run (and the CLI) talks to this cluster
    assert shutil.which("sbatch") and shutil.which("scontrol")


def reset_association_limits() -> None:
    """No MaxSubmitJobs or MaxJobs on root's hpctest association: a test sets one for itself and lifts it when it ends, but a
    session killed inside that test (kill -9, a CI timeout) leaves it on the running cluster for the next session."""
    subprocess.run(
        ["sacctmgr", "-i", "modify", "user", "root", "where", "account=hpctest", "set", "maxsubmitjobs=-1", "maxjobs=-1"],
        capture_output=True,
        timeout=60,
    )


_session_lock = None  # the open lock file while this session holds the cluster


def hold_cluster(exclusive: bool) -> None:
    """Hold the test cluster for the rest of this pytest session: shared by the sessions that use the
    2-node cluster, exclusive for one that resizes it (`start --nodes 16` ends every running job).

    A second pytest session on the same machine waits for the other (at most 8 minutes, then fails).
    """
    global _session_lock
    if _session_lock is None:
        state_dir = os.environ.get("HPC_TRAIN_SLURM_DIR", "/tmp/hpc-train-slurm").rstrip("/")
        _session_lock = open(f"{state_dir}.sessions.lock", "a+")
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    deadline = time.monotonic() + 480
    while True:
        try:
            fcntl.flock(_session_lock, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                pytest.fail(f"another pytest session held the Slurm test cluster for 8 minutes: {_session_lock.name}")
            time.sleep(2)


@pytest.fixture(scope="session")
def slurm_cluster():
    """Start (or reuse) the local Slurm cluster: munge + slurmdbd + slurmctld + 2 slurmd nodes."""
    hold_cluster(exclusive=False)
    start_slurm_cluster()
    reset_association_limits()
    yield
    # Leave the cluster running for the next session; scripts/slurm_test_cluster.sh stop ends it.


@pytest.fixture(scope="session")
def slurm_cluster_16():
    """The local Slurm cluster restarted with 16 nodes, hpcnode[01-08] and gpu-a[1-8] (SCALE_* above).

    Any test that uses it is a `scale` test (marked so at collection, deselected unless `-m` names
    scale) and runs after every other test of the session; at the end of the session the default
    2-node cluster is started again, so the next run finds what `slurm_cluster` expects. Other
    pytest sessions on this machine that use the cluster wait meanwhile (hold_cluster).
    """
    hold_cluster(exclusive=True)
    start_slurm_cluster("--nodes", str(SCALE_NODES))
    try:
        yield
    finally:
        start_slurm_cluster()
        hold_cluster(exclusive=False)


@pytest.hookimpl(tryfirst=True)
def _xdist_group(item) -> str:
    """scripts/test.sh runs the suite on 2 pytest-xdist workers with --dist loadgroup: every test that uses the
    Slurm test cluster in one group (one worker, one job at a time on the cluster, as in a serial run; its waits
    overlap the other worker's CPU work), every other file a group of its own (its module fixtures built once)."""
    names = getattr(item, "fixturenames", ())
    if item.get_closest_marker("slurm") or "slurm_cluster" in names or "slurm_cluster_16" in names:
        return "slurm"
    return item.path.name


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the xdist_group marks set here
def pytest_collection_modifyitems(config, items):
    """`scale` tests (16-node cluster): deselected unless `-m` or a file named on the command line
    picks them; when selected, they run last.

    Deselected rather than skipped, so the default run reports no skips for them. Running last
    keeps the 2-node tests of a mixed run (`-m "slurm or scale"`) on the 2-node cluster.
    """
    for item in items:
        if "slurm_cluster_16" in getattr(item, "fixturenames", ()) and item.get_closest_marker("scale") is None:
            item.add_marker(pytest.mark.scale)
        item.add_marker(pytest.mark.xdist_group(_xdist_group(item)))
    scale = [item for item in items if item.get_closest_marker("scale") is not None]
    if not scale:
        return
    if "scale" not in (config.getoption("markexpr") or ""):
        named = {(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args}
        dropped = [item for item in scale if item.path.resolve() not in named]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        scale = [item for item in scale if item not in dropped]
    items[:] = [item for item in items if item.get_closest_marker("scale") is None] + scale


def pytest_configure(config):
    """Refuse a --dist loadgroup run the installed pytest-xdist cannot group: with pytest >= 9.2, xdist <= 3.8 drops
    the groups silently (pytest-xdist#1386) and the Slurm tests would run on both workers at once."""
    if os.environ.get("PYTEST_XDIST_WORKER") or config.getoption("dist", "no") != "loadgroup":
        return
    import xdist
    from packaging.version import Version

    if Version(pytest.__version__) >= Version("9.2") and Version(xdist.__version__) < Version("3.9"):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} ignores --dist loadgroup's groups"
            " (pytest-xdist#1386). Fix: install with -c constraints.txt (pytest<9.2), as scripts/test.sh does."
        )


def pytest_collection_finish(session):
    """A worker of a --dist loadgroup run holds only grouped tests; a test without its group (a newer pytest/xdist
    pair with the same fault) stops the run instead of letting the Slurm tests share the cluster."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items if "@" not in item.nodeid.rpartition("]")[2].rpartition("::")[2]]
    if lost:
        raise pytest.UsageError(f"pytest-xdist lost the test groups of {len(lost)} tests, e.g. {lost[0]}")


def scontrol_job(job_id: str) -> Dict[str, str]:
    """`scontrol show job -d` as a dict of KEY=VALUE tokens (first occurrence wins)."""
    out = subprocess.run(["scontrol", "show", "job", "-d", str(job_id)], capture_output=True, text=True, check=True).stdout
    fields: Dict[str, str] = {}
    for token in out.split():
        if "=" in token:
            key, value = token.split("=", 1)
            fields.setdefault(key, value)
    return fields


def tres_gpus(fields: Dict[str, str]) -> int:
    match = re.search(r"gres/gpu=(\d+)", fields.get("TRES", "") or fields.get("AllocTRES", ""))
    return int(match.group(1)) if match else 0


def wait_for_job_end(job_id: str, timeout: float = 120) -> Dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = scontrol_job(job_id)
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return fields
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not end within {timeout} s: {scontrol_job(job_id).get('JobState')}")


def squeue_ids() -> List[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout
    return out.split()
