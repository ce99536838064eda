"""What one `hpc-train` job does on the launch side, whatever runs it: plan, validate, claim the run dir, then the
backend's dry run or start; and the closing lines of a job that ran."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Union

from omegaconf import DictConfig

from hpc_train.config.view import ConfigView
from hpc_train.launch.planning import auto_layout, memory_check
from hpc_train.processes.script_command import is_script_job, script_args
from hpc_train.records import performance, replicas, run_claim, rundir

if TYPE_CHECKING:
    from hpc_train.launch.backends.base import Backend


def run_job(backend: "Backend", cfg: Union[DictConfig, ConfigView], run_dir: Path, wait: bool = False) -> int:
    """Run or submit one configured job through `backend`; returns the exit code. Raises ConfigError for bad input.

    The skeleton every backend shares: the plan and the job spec made once, the run dir claimed (one live job per
    run dir; a backend that only prepares a job spec claims nothing), then the backend's dry run or start.
    wait=True follows a queued job to its end whatever launcher.wait says (a sweeper reads its result).
    """
    plan, spec, choice = auto_layout.planned(cfg, run_dir)  # strategy=auto: the layout it chose
    backend.check(plan, spec)  # what the launcher refuses (a partition, the capacity), said before an estimate
    fit = memory_check.check(plan, spec)  # MemoryRefused before anything is queued; None where it does not run
    if cfg.dry_run and is_script_job(spec):
        print(f"hpc-train (dry run): {describe_script(spec)}")
    if cfg.dry_run and choice is not None:
        print(f"hpc-train (dry run): {choice.table()}")
    if cfg.dry_run:
        if fit is not None:
            print(f"hpc-train (dry run): memory: {fit.describe()}")
        return backend.dry_run(plan, spec)
    if not backend.kind.prepares_only:  # one live job per run dir: refused here, before a byte is written
        spec["job"][run_claim.TOKEN_KEY] = claim_run_dir(run_dir)
    if choice is not None:
        print(f"hpc-train: strategy=auto chose {choice.why()}", flush=True)
        rundir.write_json_atomic(run_dir / rundir.LAYOUT_CHOICE, choice.record())
    memory_check.keep(run_dir, fit)
    return backend.start(plan, spec, wait or bool(cfg.launcher.wait))


def claim_run_dir(run_dir: Path) -> str:
    """Claim the run dir for this launch (its token, which the job spec carries to every attempt's rank 0)."""
    token = run_claim.new_token()
    taken_over = run_claim.acquire(run_dir, token)  # RunDirBusy (a RunDirRefused) while a live job holds it
    if taken_over:
        print(f"hpc-train: {taken_over}", flush=True)
    return token


def describe_script(spec: Dict[str, Any]) -> str:
    """What each task of a script job runs, in words (its first attempt; later ones add script.resume_args)."""
    script = spec["script"]
    words = shlex.join(script_args(script, resume=False))
    if script.get("launcher") == "torchrun":
        ranks = spec["job"]["layout"]["gpus_per_node"]
        return f"one task per node runs torchrun, {ranks} ranks each: {words} (in {script['cwd']})"
    return f"every task runs: python {words} (in {script['cwd']})"


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
        tokens, mfu = data.get("tokens_per_sec"), performance.mfu_text(data)
        bound = performance.input_bound_note(data, data.get(performance.NUM_WORKERS))
        print(
            f"hpc-train: done: {data['global_step']} steps, train_loss {data['train_loss']:.4f}, "
            f"eval_accuracy {acc_text}, {data['samples_per_sec']:.1f} samples/s"
            + (f", {tokens:.4g} tokens/s" if isinstance(tokens, (int, float)) else "")
            + (f", {mfu}" if mfu else "")
            + (
                f", checkpoints blocked training {data['checkpoint_blocked_s']:.1f} s"
                if data.get("checkpoint_blocked_s") is not None
                else ""
            )
            + (f"; {bound}" if bound else "")
            + replicas.summary_note(data)
        )
        print(f"hpc-train: summary {run_dir / rundir.SUMMARY}")
        print(f"hpc-train: metrics {run_dir / rundir.METRICS}")
        print(f"hpc-train: logs    {run_dir / rundir.LOGS}")
    else:
        print(rundir.closing_line(code, run_dir, since=rundir.launched_at(run_dir)))
