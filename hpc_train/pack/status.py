"""Where a packed sweep's runs stand: the pool's records, with Slurm's word on each allocation.

A run the records show waiting or running while its allocation has ended for good (cancelled, out of time or
of requeues) is CANCELLED; the report, ``--watch``, the Python API and a waiting login process read states from
here. An allocation Slurm does not know yet (just submitted) is taken as live.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

from hpc_train.jobs import job_states
from hpc_train.pack import records
from hpc_train.pack.records import RunState


def packed_states(sweep_dir: Path) -> Dict[str, RunState]:
    """Each packed run's state, by its number in the sweep."""
    ids = [str(plan.job_id) for plan in records.read_plans(sweep_dir) if plan.job_id]
    slurm = job_states.slurm_states(ids) if ids else {}
    ended = {job_id: state in job_states.ENDED for job_id, state in slurm.items()}
    return records.run_states(sweep_dir, ended)


def allocation_states(sweep_dir: Path) -> Dict[int, str]:
    """Slurm's state of each allocation, by its index (missing: Slurm does not know it)."""
    plans = [plan for plan in records.read_plans(sweep_dir) if plan.job_id]
    slurm = job_states.slurm_states([str(plan.job_id) for plan in plans]) if plans else {}
    return {plan.index: slurm[str(plan.job_id)] for plan in plans if str(plan.job_id) in slurm}
