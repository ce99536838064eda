"""Shared helpers: run the real `hpc-train` CLI in a subprocess and read what it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]

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


def run_cli(args: List[str], run_dir: Optional[Path] = None, timeout: float = 300, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run `hpc-train ARGS` as a user would; returns the finished process (stdout+stderr as text)."""
    command = [sys.executable, "-m", "hpc_train.cli", *args]
    if run_dir is not None:
        command.append(f"hydra.run.dir={run_dir}")
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def read_summary(run_dir: Path) -> Dict:
    return json.loads((run_dir / "summary.json").read_text())


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout}\nSTDERR:\n{proc.stderr}"


@pytest.fixture
def cli():
    return run_cli
