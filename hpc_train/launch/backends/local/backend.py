"""The local backend: the ranks as processes of this machine (``launcher=local``), and the watch on such a job."""

from __future__ import annotations

from typing import Any, Dict, Optional

from hpc_train.jobs import job_states as states
from hpc_train.launch.backends.base import Backend, JobRef, JobWatch
from hpc_train.launch.backends.local.groups import run_groups
from hpc_train.launch.backends.local.processes import container_line, run_local
from hpc_train.launch.backends.run import report_summary
from hpc_train.launch.planning.jobspec import write_job_spec
from hpc_train.launch.planning.plan import RunPlan, count_local_gpus
from hpc_train.launch.planning.replica_checks import say_groups
from hpc_train.records import run_claim, rundir


class LocalBackend(Backend):
    """One process per task on this machine, torchrun-style (``local.run_local``); the command ends with the job."""

    def dry_run(self, plan: RunPlan, spec: Dict[str, Any]) -> int:
        print(f"hpc-train (dry run, local): {plan.layout.describe(on_cpus=count_local_gpus() == 0)}")
        say_groups(plan.config, plan.layout, plan.run_dir, slurm=False)
        print(f"  run dir: {plan.run_dir}")
        line = container_line(plan)
        if line:
            print(f"  {line}")
        return 0

    def start(self, plan: RunPlan, spec: Dict[str, Any], wait: bool) -> int:
        run_dir = plan.run_dir
        try:
            config_path = write_job_spec(spec, run_dir)
            print(f"hpc-train: {plan.layout.describe(on_cpus=count_local_gpus() == 0)}")
            say_groups(plan.config, plan.layout, plan.run_dir, slurm=False)
            print(f"hpc-train: run dir {run_dir}")
            if (plan.config.get("fault_tolerance") or {}).get("replica_groups"):  # groups, their lighthouse, restarts
                code = run_groups(plan, config_path)
            else:
                code = run_local(plan, config_path, plan.config.launcher.get("master_port"))
        finally:  # this process held the run dir for its local ranks
            run_claim.release(run_dir, spec["job"][run_claim.TOKEN_KEY])
        report_summary(run_dir, code)
        return code

    def watch(self, ref: JobRef) -> JobWatch:
        return LocalWatch(ref)


class LocalWatch(JobWatch):
    """A local job: the background hpc-train process running it (a local sweep's jobs share one, one after another).

    Its state in Slurm's words: RUNNING while the process runs, then from its exit code and summary.json; a job of
    a sweep has ended once the next job's dir has started (or the process ended). A job stopped by a signal after
    its checkpoint is CANCELLED.
    """

    poll_s = 0.2

    @property
    def command_is_the_job(self) -> bool:
        """The process is this job's own hpc-train command (not a sweep's): its exit code is the job's."""
        return self.ref.sweep_index is None

    def exit_code(self) -> Optional[int]:
        process = self.ref.process
        return process.poll() if process is not None else None

    def state(self) -> str:
        process, code = self.ref.process, self.exit_code()
        has_summary = (self.ref.run_dir / rundir.SUMMARY).exists()
        if self.command_is_the_job:
            if process is not None and code is None:
                return "RUNNING"
            return states.state_of_exit(code, has_summary)
        started = (self.ref.run_dir / ".hydra").exists()
        following = self.ref.next_run_dir
        ended = (process is None or code is not None) or (following is not None and (following / ".hydra").exists())
        if not ended:
            return "RUNNING" if started else "PENDING"
        if has_summary:
            return "COMPLETED"
        return "CANCELLED" if states.stopped(code) else "FAILED"

    def cancel(self) -> None:
        """SIGTERM to hpc-train, whose ranks checkpoint and stop (a local sweep's jobs share it: the sweep stops)."""
        process = self.ref.process
        if process is not None and process.poll() is None:
            process.terminate()
