"""Ask the Slurm test cluster about jobs (scontrol, squeue), as the Slurm tests check what a submission did."""

from __future__ import annotations

import re
import subprocess
import time
from typing import Dict, List


def scontrol_job(job_id: str) -> Dict[str, str]:
    """`scontrol show job -d` as a dict of KEY=VALUE tokens (first occurrence wins)."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-d", str(job_id)], capture_output=True, text=True, check=True
    ).stdout
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
