"""Rerun only what failed: ``hpc-train-report SWEEP_DIR --rerun-failed``.

At submission every Slurm job of a sweep (hpc-train's own or a Hydra app's) leaves one line in
``<sweep dir>/.hpc_train/submissions.jsonl``: its Slurm id, job number, submitit folder, sbatch
parameters and requeue budget. submitit keeps what the job runs (``<id>_submitted.pkl``, read
back through ``Job.submission()``). A rerun finds the jobs whose newest attempt ended FAILED,
CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY or was otherwise not COMPLETED, submits exactly
what each ran, with its parameters, again (same job number, same job dir: an hpc-train job
resumes from its checkpoint), and appends the new attempt to ``jobs.tsv`` (a second row for the
same job number: every reader takes the newest row of a job). The failed runs of a packed sweep go again
together, in one new allocation (hpc_train.launch.backends.slurm.packed_rerun). No torch here: a login node runs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from hpc_train.config.launcher import APP_LOCAL
from hpc_train.jobs import job_table, study
from hpc_train.jobs.job_states import ENDED, slurm_job_states
from hpc_train.jobs.submissions import SUBMISSIONS, record, submissions
from hpc_train.launch.backends.slurm.packed_rerun import rerun_packed
from hpc_train.pack.records import is_packed_id
from hpc_train.records import rundir


def rerun_failed(sweep_dir: Path) -> Tuple[int, Optional[str]]:
    """Resubmit the jobs whose newest attempt did not complete; (how many, a refusal in words or None)."""
    if study.journal_path(sweep_dir).exists():
        return 0, (
            f"{sweep_dir} holds an adaptive study: its controller runs its trials and a failed trial stays failed;"
            " run the study's command again (the same hydra.sweep.dir) to go on with it"
        )
    newest = job_table.newest(sweep_dir)
    if not newest:
        return 0, f"{sweep_dir} has no {rundir.JOB_TABLE}: only a Slurm sweep's jobs can be rerun"
    recorded = submissions(sweep_dir)  # job id -> how it was submitted: read once, with the job table
    packed = {number: row for number, row in newest.items() if is_packed_id(row.job_id)}
    rows = {number: row for number, row in newest.items() if number not in packed}
    failed, refusal = _failed_jobs(sweep_dir, rows, recorded) if rows else ({}, None)
    if refusal:
        return 0, refusal
    count = _resubmit(sweep_dir, failed, recorded) if failed else 0
    if not packed:
        return count, None
    again, refusal = rerun_packed(sweep_dir, packed)
    return count + again, refusal


def _failed_jobs(
    sweep_dir: Path, rows: Dict[str, job_table.JobRow], recorded: Dict[str, Dict[str, Any]]
) -> Tuple[Dict[str, Tuple[job_table.JobRow, str]], Optional[str]]:
    """Which of `rows` (job number -> its newest row) ended and did not complete, each with its state; or a refusal
    in words (a local sweep; a job with no submission record in `recorded`, job id -> record, to submit again)."""
    if any(entry.get("local") for entry in recorded.values()):
        return {}, (
            f"{sweep_dir} is a local sweep (hydra/launcher={APP_LOCAL.name}): only a Slurm sweep's jobs are rerun;"
            " run the sweep again"
        )
    # Without Slurm's accounting, how an ended job went comes from its run dir (job_states.run_dir_state).
    run_dirs = {row.job_id: Path(sweep_dir) / number for number, row in rows.items()}
    states = {job_id: state.state for job_id, state in slurm_job_states(run_dirs, run_dirs).items()}
    failed = {
        number: (row, states[row.job_id])
        for number, row in rows.items()
        if states.get(row.job_id) in ENDED and states[row.job_id] != "COMPLETED"
    }
    missing = [row.job_id for row, _ in failed.values() if row.job_id not in recorded]
    if missing:
        return {}, (
            f"no submission record for job(s) {', '.join(missing)} in {Path(sweep_dir) / SUBMISSIONS}: the sweep was"
            " submitted by an hpc-train older than --rerun-failed; rerun those jobs with their overrides by hand"
        )
    return failed, None


def _resubmit(
    sweep_dir: Path, failed: Dict[str, Tuple[job_table.JobRow, str]], recorded: Dict[str, Dict[str, Any]]
) -> int:
    """Submit each of `failed` again as it was (its submitit folder, what it ran, its sbatch parameters and requeue
    budget, from its record in `recorded`) and add the new attempts to the sweep's records; how many."""
    # launch.slurm loads OmegaConf and the planner (~0.1 s): hpc-train-report and the API import this module too
    from hpc_train.launch.backends.slurm.submit import make_executor
    from hpc_train.launch.backends.slurm.submitit_import import submitit_module

    submitit = submitit_module()  # (~50 ms): only a rerun submits; hpc-train-report and the API import this module
    new_rows, entries = [], []
    for number, (row, state) in sorted(failed.items(), key=lambda item: int(item[0])):
        entry = recorded[row.job_id]
        folder = Path(entry["folder"])
        delayed = submitit.SlurmJob(folder=folder, job_id=row.job_id).submission()
        executor = make_executor(folder, entry["params"], int(entry["max_requeues"]))
        handle = executor.submit(delayed.function, *delayed.args, **delayed.kwargs)
        print(f"hpc-train: job #{number} ({row.overrides}): {state} as {row.job_id}, resubmitted as {handle.job_id}")
        new_rows.append(job_table.JobRow(str(handle.job_id), number, row.overrides, row.layout))
        entries.append({**entry, "job_id": str(handle.job_id), "rerun_of": row.job_id})
    record(sweep_dir, entries)
    job_table.print_and_append(sweep_dir, new_rows)
    return len(new_rows)
