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
from typing import Dict, Optional, Tuple

from hpc_train.config.launcher import APP_LOCAL
from hpc_train.jobs import job_table
from hpc_train.jobs.job_states import ENDED, slurm_job_states
from hpc_train.jobs.submissions import SUBMISSIONS, record, submissions
from hpc_train.launch.backends.slurm.packed_rerun import rerun_packed
from hpc_train.pack.records import is_packed_id
from hpc_train.records import rundir


def rerun_failed(sweep_dir: Path) -> Tuple[int, Optional[str]]:
    """Resubmit the jobs whose newest attempt did not complete; (how many, a refusal in words or None)."""
    newest = job_table.newest(sweep_dir)
    if not newest:
        return 0, f"{sweep_dir} has no {rundir.JOB_TABLE}: only a Slurm sweep's jobs can be rerun"
    packed = {number: row for number, row in newest.items() if is_packed_id(row.job_id)}
    rows = {number: (row.job_id, row.overrides, row.layout) for number, row in newest.items() if number not in packed}
    count, refusal = _rerun_jobs(sweep_dir, rows) if rows else (0, None)
    if refusal or not packed:
        return count, refusal
    again, refusal = rerun_packed(sweep_dir, packed)
    return count + again, refusal


def _rerun_jobs(sweep_dir: Path, rows: Dict[str, Tuple[str, str, str]]) -> Tuple[int, Optional[str]]:
    """Resubmit, each as it was, the jobs of `rows` (job number -> job id, overrides, layout) that did not complete."""
    # launch.slurm loads OmegaConf and the planner (~0.1 s): hpc-train-report and the API import this module too
    from hpc_train.launch.backends.slurm.submit import make_executor
    from hpc_train.launch.backends.slurm.submitit_import import submitit_module

    recorded = submissions(sweep_dir)
    if any(entry.get("local") for entry in recorded.values()):
        return (
            0,
            f"{sweep_dir} is a local sweep (hydra/launcher={APP_LOCAL.name}): only a Slurm sweep's jobs are rerun;"
            " run the sweep again",
        )
    # Without Slurm's accounting, how an ended job went comes from its run dir (job_states.run_dir_state).
    run_dirs = {job_id: Path(sweep_dir) / number for number, (job_id, _, _) in rows.items()}
    states = slurm_job_states(run_dirs, run_dirs)
    failed = {
        number: row
        for number, row in rows.items()
        if row[0] in states and states[row[0]].state in ENDED and states[row[0]].state != "COMPLETED"
    }
    missing = [row[0] for row in failed.values() if row[0] not in recorded]
    if missing:
        return 0, (
            f"no submission record for job(s) {', '.join(missing)} in {Path(sweep_dir) / SUBMISSIONS}: the sweep was"
            " submitted by an hpc-train older than --rerun-failed; rerun those jobs with their overrides by hand"
        )
    submitit = submitit_module()  # (~50 ms): only a rerun submits; hpc-train-report and the API import this module

    new_rows, entries = [], []
    for number, (job_id, overrides, layout) in sorted(failed.items(), key=lambda item: int(item[0])):
        entry = recorded[job_id]
        folder = Path(entry["folder"])
        delayed = submitit.SlurmJob(folder=folder, job_id=job_id).submission()
        executor = make_executor(folder, entry["params"], int(entry["max_requeues"]))
        handle = executor.submit(delayed.function, *delayed.args, **delayed.kwargs)
        print(
            f"hpc-train: job #{number} ({overrides}): {states[job_id].state} as {job_id},"
            f" resubmitted as {handle.job_id}"
        )
        new_rows.append(job_table.JobRow(str(handle.job_id), number, overrides, layout))
        entries.append({**entry, "job_id": str(handle.job_id), "rerun_of": job_id})
    if new_rows:
        record(sweep_dir, entries)
        job_table.print_and_append(sweep_dir, new_rows)
    return len(new_rows), None
