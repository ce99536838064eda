"""Run the real `hpc-train` CLI (or a fresh interpreter) in a subprocess, as a user would, and read what it wrote."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

if TYPE_CHECKING:
    import torch

from hpc_train.processes.warm_ranks import FORK_SERVER_VARIABLE
from tests.support.paths import REPO

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


def run_cli(
    args: List[str],
    run_dir: Optional[Path] = None,
    timeout: float = 300,
    env: Optional[Dict[str, str]] = None,
    gpus: bool = False,
    cwd: Optional[Path] = None,
) -> subprocess.CompletedProcess:
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


# Hydra's flags that print and end before anything runs (`-c` only whole: `-cd`, `-cp`, `-cn` name config dirs).
PRINTING_FLAGS = ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "--version")
PRINTING_FLAGS += ("-sc", "--shell-completion")


def run_cli_in_process(
    args: List[str],
    run_dir: Optional[Path] = None,
    env: Optional[Dict[str, str]] = None,
    gpus: bool = False,
    cwd: Optional[Path] = None,
    refused: bool = False,
) -> subprocess.CompletedProcess:
    """`hpc-train ARGS` called in this process, for a command that starts nothing: what run_cli returns for it (exit
    code, stdout, stderr) without starting a Python (tests/support/in_process.py gives the call a new process's state).

    Only a dry run (`dry_run=true`), a Hydra flag that prints and ends (`--cfg`, `--info`, `--help`, ...) or, with
    `refused=True`, a command the test expects refused (exit code not 0); a process the call would start (a rank, or
    `sinfo` for the capacity check) fails the test, naming run_cli for it instead.
    """
    from tests.support.in_process import fresh_process
    from tests.support.no_process import WHERE_TO, ProcessStarted, processes_refused

    argv = [*args, *([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])]
    command = f"hpc-train {shlex.join(argv)}"
    assert refused or _starts_nothing(argv), f"{command} may start a run: use run_cli, or refused=True for a refusal"
    env = dict(os.environ if env is None else env, **({} if gpus else {"CUDA_VISIBLE_DEVICES": ""}))
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with fresh_process(argv, env, cwd or REPO), processes_refused():
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = _exit_code_of_main()
    except ProcessStarted as started:
        started_what = str(started).replace(f": {WHERE_TO}", "")
        raise AssertionError(f"{command} started a process ({started_what}): run it with run_cli") from None
    assert not (refused and code == 0), f"{command} was not refused:\n{stdout.getvalue()}{stderr.getvalue()}"
    return subprocess.CompletedProcess(["hpc-train", *argv], code, stdout.getvalue(), stderr.getvalue())


def _starts_nothing(argv: List[str]) -> bool:
    dry_runs = [arg.partition("=")[2].lower() for arg in argv if arg.lstrip("+").startswith("dry_run=")]
    flags = {arg.partition("=")[0] for arg in argv if arg.startswith("-")}
    return (bool(dry_runs) and dry_runs[-1] == "true") or bool(flags & set(PRINTING_FLAGS))


def _exit_code_of_main() -> int:
    """hpc_train.cli.main's exit code as the interpreter would make it: SystemExit's code, 1 after a traceback."""
    from tests.support.in_process import cli_main

    main = cli_main()
    try:
        main()
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        return 1
    return 0


def user_cluster_conf(root: Path, gpus_per_node: int = 2) -> Path:
    """A user's own config dir under `root` (for --config-dir): cluster=mysite, a profile inheriting the shipped slurm
    one with its own partition (gpu_p2), GPUs per node and time limit (5 minutes)."""
    conf = root / "my_conf"
    (conf / "cluster").mkdir(parents=True)
    (conf / "cluster" / "mysite.yaml").write_text(
        "defaults:\n  - slurm\n  - _self_\n\nname: mysite\npartition: gpu_p2\ncpus_per_gpu: 1\ngpus_per_node: "
        f"{gpus_per_node}\ntime: '00:05:00'\n"
    )
    return conf


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


def start_background(
    args: List[str], run_dir: Path, extra_env: Dict[str, str], stderr=subprocess.DEVNULL, cwd: Optional[Path] = None
) -> subprocess.Popen:
    """`hpc-train ARGS` in its own process group (so kill_group reaches the launcher and every rank): its ranks are
    fresh processes, never forked warm by the fork server (tests/support/warm_ranks.py), which is outside the group."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", **extra_env)
    env.pop(FORK_SERVER_VARIABLE, None)
    return subprocess.Popen(
        [sys.executable, "-m", "hpc_train.cli", *args, f"hydra.run.dir={run_dir}"],
        cwd=cwd or REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
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


def kill9_after_checkpoints(
    args: List[str], run_dir: Path, count: int = 2, cwd: Optional[Path] = None, step_sleep: float = 0.15
) -> int:
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
