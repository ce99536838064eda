"""One run dir, one live job: a launch into a run dir that a live job holds is refused before it touches anything;
a dead holder's claim is taken over and the next attempt resumes. Real local launches (a Slurm job as the holder:
tests/slurm/test_run_claim_on_slurm.py; a holder on another host: tests/unit/test_run_claim_other_host.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from hpc_train.records import run_claim
from tests.support.cli import TINY, assert_ok, read_summary, run_cli
from tests.support.paths import REPO

PACED = [
    *TINY,
    "strategy=single",
    "trainer.eval=false",
    "trainer.checkpoint_every=10",
    "trainer.step={_target_:tests.support.paced_steps.paced,_partial_:true}",
]  # 0.2 s a step


def launch(args: List[str], run_dir: Path) -> subprocess.Popen:
    """hpc-train in a session of its own (a second terminal), GPUs hidden."""
    command = [sys.executable, "-m", "hpc_train.cli", *args, f"hydra.run.dir={run_dir}"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def wait_for_step(run_dir: Path, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        rows = (
            [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            if (run_dir / "metrics.jsonl").exists()
            else []
        )
        if any(isinstance(r.get("step"), int) and r["step"] >= step for r in rows):
            return
        assert time.monotonic() < deadline, f"no step {step} within {timeout} s"
        time.sleep(0.2)


def snapshot(run_dir: Path, names: List[str]) -> Dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in names}


def starts(run_dir: Path) -> List[dict]:
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    return [r for r in records if r["event"] == "start"]


def test_a_second_launch_into_a_live_run_dir_is_refused_before_it_touches_anything(tmp_path):
    run_dir = tmp_path / "run"
    first = launch([*PACED, "trainer.max_steps=40"], run_dir)
    wait_for_step(run_dir, 10)
    kept = [".hydra/config.yaml", ".hydra/overrides.yaml", ".hydra/hydra.yaml", "job_config.yaml", "cli.log"]
    before = snapshot(run_dir, kept)
    second = run_cli([*PACED, "trainer.max_steps=40"], run_dir)
    assert second.returncode == 2, second.stdout + second.stderr
    said = second.stdout + second.stderr
    assert f"run dir {run_dir} is in use by pid {first.pid} on " in said and "its process is alive" in said
    assert "hydra.run.dir" in said and f"kill {first.pid}" in said and "Traceback" not in said
    assert snapshot(run_dir, kept) == before, "the refused launch wrote into the run dir"
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    assert read_summary(run_dir)["global_step"] == 40
    assert [(r["attempt"], r["resumed_from_step"]) for r in starts(run_dir)] == [(1, None)]
    assert "removed" not in (run_dir / "logs" / "rank0.log").read_text()
    assert not (run_dir / run_claim.CLAIM).exists(), "a finished run frees its run dir"


def test_a_sigkilled_holder_is_taken_over_and_the_relaunch_resumes(tmp_path):
    run_dir = tmp_path / "run"
    first = launch([*PACED, "trainer.max_steps=30"], run_dir)
    wait_for_step(run_dir, 12)  # a checkpoint at step 10 is on disk
    os.killpg(first.pid, signal.SIGKILL)  # the launcher and its rank, as a node failure would
    first.wait()
    assert json.loads((run_dir / run_claim.CLAIM).read_text())["pid"] == first.pid, "the dead holder's claim is left"
    again = run_cli([*PACED, "trainer.max_steps=30"], run_dir)
    assert_ok(again)
    said = again.stdout + again.stderr
    assert re.search(
        rf"taking over run dir {re.escape(str(run_dir))} from pid {first.pid} on .*: its process \(pid"
        rf" {first.pid} on .*\) is gone",
        said,
    ), said
    resumed = starts(run_dir)[-1]["resumed_from_step"]
    assert resumed is not None and resumed >= 10 and read_summary(run_dir)["global_step"] == 30
