"""What one `hpc-train` job does on the launch side: plan, validate, then start or submit."""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any, Dict

from omegaconf import DictConfig

from hpc_train.jobs import job_states, submissions
from hpc_train.launch.backends import slurm, slurm_follow
from hpc_train.launch.backends.local import run_local
from hpc_train.launch.planning.errors import JobFailed, StoppedWaiting
from hpc_train.launch.planning.jobspec import build_job_spec, write_job_spec
from hpc_train.launch.planning.plan import count_local_gpus, make_plan
from hpc_train.processes.script_command import is_script_job, script_args
from hpc_train.records import hang, run_claim, rundir
from hpc_train.records.rank_errors import refusal_words


def run_job(cfg: DictConfig, run_dir: Path, wait: bool = False) -> int:
    """Run or submit one configured job; returns the exit code. Raises ConfigError for bad input.

    wait=True follows a Slurm job to its end whatever launcher.wait says (a sweeper reads its result).
    """
    plan = make_plan(cfg, run_dir)
    spec = build_job_spec(plan)
    if cfg.dry_run and is_script_job(spec):
        print(f"hpc-train (dry run): {describe_script(spec)}")
    if not cfg.dry_run:  # one live job per run dir: refused here, before a byte is written
        spec["job"][run_claim.TOKEN_KEY] = claim_run_dir(run_dir)
    if cfg.launcher.name == "slurm":
        return _slurm(cfg, plan, spec, wait or bool(cfg.launcher.wait))
    if cfg.dry_run:
        print(f"hpc-train (dry run, local): {plan.layout.describe(on_cpus=count_local_gpus() == 0)}")
        print(f"  run dir: {run_dir}")
        return 0
    try:
        config_path = write_job_spec(spec, run_dir)
        print(f"hpc-train: {plan.layout.describe(on_cpus=count_local_gpus() == 0)}")
        print(f"hpc-train: run dir {run_dir}")
        code = run_local(plan, config_path, cfg.launcher.get("master_port"))
    finally:  # this process held the run dir for its local ranks
        run_claim.release(run_dir, spec["job"][run_claim.TOKEN_KEY])
    report_summary(run_dir, code)
    return code


def claim_run_dir(run_dir: Path) -> str:
    """Claim the run dir for this launch (its token, which the job spec carries to every attempt's rank 0)."""
    token = run_claim.new_token()
    try:
        taken_over = run_claim.acquire(run_dir, token)
    except run_claim.RunDirBusy as busy:
        raise JobFailed(str(busy), exit_code=rundir.EXIT_REFUSED) from None
    if taken_over:
        print(f"hpc-train: {taken_over}", flush=True)
    return token


def _slurm(cfg: DictConfig, plan, spec: Dict[str, Any], wait: bool) -> int:
    job = slurm.prepare(plan, spec)
    if cfg.dry_run:
        print(slurm.render_sbatch(plan.run_dir / rundir.SLURM_LOGS, job.params))
        print(f"hpc-train (dry run, nothing submitted): {plan.layout.describe()}")
        return 0
    # Submitted first, the job spec written after: a refused sbatch (a ConfigError) leaves no
    # job_config.yaml, and submit_jobs removes submitit's files, so nothing half-made remains.
    # Slurm tasks get the spec pickled by submitit; job_config.yaml is the readable record.
    token = spec["job"][run_claim.TOKEN_KEY]
    try:
        with slurm.Queueing(1) as queueing:  # Ctrl-C until the job is written down: it is cancelled
            [(_, handle)] = queueing.submitted = slurm.submit_jobs([job])
            run_claim.note_slurm_job(plan.run_dir, token, str(handle.job_id))
            write_job_spec(spec, plan.run_dir)
            submissions.record(
                plan.run_dir, slurm.submission_records([(job, handle)], ["0"])
            )  # what the Python API reads
    except BaseException:
        run_claim.release(plan.run_dir, token)
        raise
    folder = plan.run_dir / rundir.SLURM_LOGS
    print(f"hpc-train: submitted Slurm job {handle.job_id}: {plan.layout.describe()}")
    print(f"hpc-train: run dir {plan.run_dir}")
    print(
        f"hpc-train: Slurm logs {folder}/{handle.job_id}_<task>_log.out / .err; rank logs {plan.run_dir / rundir.LOGS}"
    )
    if not wait:
        return 0
    return follow(handle, plan.run_dir)


def describe_script(spec: Dict[str, Any]) -> str:
    """What each task of a script job runs, in words (its first attempt; later ones add script.resume_args)."""
    script = spec["script"]
    words = shlex.join(script_args(script, resume=False))
    if script.get("launcher") == "torchrun":
        return f"one task per node runs torchrun, {spec['job']['layout']['gpus_per_node']} ranks each: {words} (in {script['cwd']})"
    return f"every task runs: python {words} (in {script['cwd']})"


def follow(handle: Any, run_dir: Path) -> int:
    """Wait for a submitted job to end (its last attempt, when Slurm requeued it) and report how it ended."""
    submitted = time.time()
    try:
        ending = slurm_follow.follow(handle, run_dir, since=rundir.launched_at(run_dir))
    except KeyboardInterrupt:  # Ctrl-C while waiting: the job is Slurm's now, and goes on
        raise StoppedWaiting(str(handle.job_id), run_dir) from None
    if ending.error is None:
        code = 0
    else:  # submitit re-raises the remote failure; its traceback is in the Slurm log
        verdict = hang.read_request(run_dir, since=submitted)
        rank, error = job_states.rank_error(run_dir, submitted)
        refused = refusal_words(error)
        if verdict is not None and verdict.get("state") == hang.STOPPING:  # the watchdog's words, not submitit's
            print(verdict.get("message", ""))
            code = rundir.EXIT_HUNG
        elif refused:  # a rank's refusal (bad input, a full disk): its one message, and which kind in the last line
            print(f"hpc-train: {refused}")
            code = rundir.EXIT_REFUSED
        else:
            print(f"hpc-train: job {handle.job_id} failed: {_why(ending, rank, error)}")
            code = 1
    report_summary(run_dir, code)
    return code


def _why(ending: slurm_follow.Ending, rank: Any, error: Any) -> str:
    """One line for a failed job: its failing rank's error, else the run dir's or Slurm's word, else submitit's first
    line that says something (its "failed during processing with trace:" says nothing)."""
    if error:
        return f"rank {rank}: {error}"
    if ending.detail:
        return f"{ending.state or 'ended'}: {ending.detail}"
    lines = [line.strip(" -") for line in str(ending.error).splitlines()]
    words = [line for line in lines if line and not line.endswith("with trace:")]
    return (ending.state + ": " if ending.state and ending.state != "COMPLETED" else "") + (
        words[0] if words else type(ending.error).__name__
    )


def report_summary(run_dir: Path, code: int) -> None:
    """The job's closing lines: its summary when it finished, else how it ended (rundir.CLOSING_LINES)."""
    data = rundir.read_summary(run_dir) if code == rundir.EXIT_OK else None
    if data is not None and "script" in data:  # a script job's summary (hpc_train.compute.entry.script_job)
        print(f"hpc-train: done: {' '.join(map(str, data['script']))} finished (attempt {data.get('attempts')})")
        print(f"hpc-train: summary {run_dir / rundir.SUMMARY}")
        print(f"hpc-train: logs    {run_dir / rundir.LOGS}")
    elif data is not None:
        acc = data.get("eval_accuracy")
        acc_text = "n/a" if acc is None else f"{acc:.4f}"
        print(
            f"hpc-train: done: {data['global_step']} steps, train_loss {data['train_loss']:.4f}, "
            f"eval_accuracy {acc_text}, {data['samples_per_sec']:.1f} samples/s"
            + (
                f", checkpoints blocked training {data['checkpoint_blocked_s']:.1f} s"
                if data.get("checkpoint_blocked_s") is not None
                else ""
            )
        )
        print(f"hpc-train: summary {run_dir / rundir.SUMMARY}")
        print(f"hpc-train: metrics {run_dir / rundir.METRICS}")
        print(f"hpc-train: logs    {run_dir / rundir.LOGS}")
    else:
        print(rundir.closing_line(code, run_dir, since=rundir.launched_at(run_dir)))
