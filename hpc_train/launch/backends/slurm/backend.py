"""The Slurm backend (``launcher=slurm``): a job queued through submitit, ``srun`` starting every task; and the watch
on a queued job (its state from squeue and sacct, or the run dir without accounting)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Dict

from hpc_train.jobs import job_states as states
from hpc_train.jobs import submissions
from hpc_train.launch.backends.base import Backend, JobRef, JobWatch
from hpc_train.launch.backends.slurm import queueing as slurm_queueing
from hpc_train.launch.backends.slurm import script as slurm_script
from hpc_train.launch.backends.slurm import submit as slurm
from hpc_train.launch.backends.slurm.follow import follow_job
from hpc_train.launch.planning.jobspec import write_job_spec
from hpc_train.launch.planning.plan import RunPlan
from hpc_train.launch.planning.replica_checks import say_groups
from hpc_train.pack.records import is_packed_id, split_packed_id
from hpc_train.pack.status import SharedPackedStates
from hpc_train.records import run_claim, rundir
from hpc_train.remote.paths import cluster_side
from hpc_train.remote.settings import RemoteSettings
from hpc_train.slurm import slurm_cli


class SlurmBackend(Backend):
    """sbatch through submitit (its batch script, its pickled task); the command returns once the job is queued, or
    follows it to the end of its last attempt (``launcher.wait``)."""

    def check(self, plan: RunPlan, spec: Dict[str, Any]) -> None:
        slurm.prepare(plan, spec)  # the partition and capacity checks (again when the job is prepared: cheap)

    def dry_run(self, plan: RunPlan, spec: Dict[str, Any]) -> int:
        """The sbatch script printed, as the machine that submits it will write it: from a laptop (cluster.login),
        the cluster's Python and run dir, what only the cluster knows said plainly."""
        side = cluster_side(RemoteSettings.of(plan.config), Path.cwd()) if plan.config.cluster.get("login") else None
        shown = plan if side is None else replace(plan, run_dir=side.render_dir(plan.run_dir))
        job = slurm.prepare(shown, spec)  # the partition and capacity checks run in a dry run too
        python = side.python if side else None
        script = slurm_script.render_sbatch(shown.run_dir / rundir.SLURM_LOGS, job.params, python)
        print(script if side is None else side.shown(script))
        if side is not None:
            print(f"hpc-train (dry run): {side.note(side.path_of(plan.run_dir))}")
        print(f"hpc-train (dry run, nothing submitted): {plan.layout.describe()}")
        say_groups(plan.config, plan.layout, plan.run_dir, slurm=True)
        return 0

    def start(self, plan: RunPlan, spec: Dict[str, Any], wait: bool) -> int:
        # Submitted first, the job spec written after: a refused sbatch (a ConfigError) leaves no
        # job_config.yaml, and submit_jobs removes submitit's files, so nothing half-made remains.
        # Slurm tasks get the spec pickled by submitit; job_config.yaml is the readable record.
        token = spec["job"][run_claim.TOKEN_KEY]
        try:
            job = slurm.prepare(plan, spec)
            with slurm_queueing.Queueing(1) as queueing:  # Ctrl-C until the job is written down: it is cancelled
                [(_, handle)] = queueing.submitted = slurm.submit_jobs([job])
                run_claim.note_slurm_job(plan.run_dir, token, str(handle.job_id))
                write_job_spec(spec, plan.run_dir)
                # what the Python API and a rerun read
                submissions.record(plan.run_dir, slurm.submission_records([(job, handle)], ["0"]))
        except BaseException:
            run_claim.release(plan.run_dir, token)
            raise
        folder = plan.run_dir / rundir.SLURM_LOGS
        print(f"hpc-train: submitted Slurm job {handle.job_id}: {plan.layout.describe()}")
        say_groups(plan.config, plan.layout, plan.run_dir, slurm=True)
        print(f"hpc-train: run dir {plan.run_dir}")
        print(
            f"hpc-train: Slurm logs {folder}/{handle.job_id}_<task>_log.out / .err;"
            f" rank logs {plan.run_dir / rundir.LOGS}"
        )
        if not wait:
            return 0
        return follow_job(handle, plan.run_dir)

    def watch(self, ref: JobRef) -> JobWatch:
        return SlurmWatch(ref)


class SlurmWatch(JobWatch):
    """A queued job by its id: squeue and sacct (a sweep's jobs read together), else its run dir; a packed run
    (``<allocation>:<run>``) by its allocation's records (hpc_train.pack.status)."""

    poll_s = 1.0

    def __init__(self, ref: JobRef) -> None:
        super().__init__(ref)
        if ref.shared_states is None and is_packed_id(ref.job_id):  # a packed run's state: its sweep's records
            ref.shared_states = SharedPackedStates(ref.run_dir.parent)

    def state(self) -> str:
        ref = self.ref
        if ref.shared_states is not None:
            state = ref.shared_states.get(ref.job_id)
        else:  # no accounting: an ended job's run dir says how it ended
            state = states.slurm_states([ref.job_id], {ref.job_id: ref.run_dir}).get(ref.job_id)
        if state:
            return state
        # Between squeue forgetting a job and sacct recording it.
        return "COMPLETED" if (ref.run_dir / rundir.SUMMARY).exists() else "UNKNOWN"

    def cancel(self) -> None:
        """``scancel``; a packed run shares its allocation with other runs, so cancelling one raises ValueError."""
        if is_packed_id(self.ref.job_id):
            allocation = split_packed_id(self.ref.job_id)[0]
            raise ValueError(
                f"job {self.ref.job_id} is a run of packed allocation {allocation}, which runs other runs too: only"
                f" the whole allocation can be cancelled (scancel {allocation})"
            )
        slurm_cli.run(["scancel", self.ref.job_id])
