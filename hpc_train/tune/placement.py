"""Where an adaptive study's controller runs (``hydra.sweeper.controller``), and the one controller a study has.

A study has one controller at a time: it claims its sweep dir as a job claims its run dir (hpc_train.records.run_claim:
``<sweep dir>/.claim.json``, naming its process or Slurm job and the command line that started it, refreshed every
``REFRESH_S`` while it runs). A second controller on a sweep dir whose controller is alive is refused before it does
anything (ConfigError, naming the live one and how to follow or stop it); a dead one's claim is taken over. The claim
is also the controller's heartbeat that ``hpc-train-report`` reads (hpc_train.jobs.study.controller_state).

``here`` (the default): this command is the controller. ``detached``: this command starts the same command line with
``controller=here`` as a process of its own session (stdin closed, its output in ``<sweep dir>/controller.log``), so
that closing the terminal does not stop it, and returns. ``slurm``: the same, as a one-task Slurm job without GPUs
(``controller_time`` its limit). Either way the parent claims the sweep dir for the child before it returns (the
child's pid, or its Slurm job), and the child takes the claim as its own through :data:`TOKEN_VARIABLE`, so the study
is never left unclaimed in between. Running the same command again resumes the study (the claim refuses a second
live controller).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from omegaconf import OmegaConf

from hpc_train.errors import ConfigError
from hpc_train.launch.backends.slurm.params import cluster_account, cluster_qos
from hpc_train.launch.hydra import cli_child, forwarding
from hpc_train.records import run_claim, rundir
from hpc_train.slurm import slurm_cli
from hpc_train.tune.settings import PREFIX, TuneSettings

TOKEN_VARIABLE = "HPC_TRAIN_STUDY_CLAIM"  # set by a parent that claimed the sweep dir for the controller it started
LOG = "controller.log"  # in the sweep dir: a detached or Slurm controller's output
SBATCH_SCRIPT = "controller.sbatch"  # in the sweep dir: controller=slurm's batch script
SLURM_CPUS = 2  # the controller's job: it waits on its trials' jobs and asks Optuna, nothing more


def user_command() -> List[str]:
    """This command line as the user would type it again: ``hpc-train ...`` or ``python app.py ...``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == "hpc_train.cli" or Path(sys.argv[0]).name == "hpc-train":
        return ["hpc-train", *sys.argv[1:]]
    if spec is not None:
        return ["python", "-m", spec.name, *sys.argv[1:]]
    return ["python", sys.argv[0], *sys.argv[1:]]


def _child_command(sweep_dir: Path) -> List[str]:
    """The same command line, run by this Python, with the study's controller here and its sweep dir pinned (a
    ``${now:...}`` default would name another dir later)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    program = ["-m", spec.name] if spec is not None else [sys.argv[0]]
    pinned = (f"{PREFIX}.controller=", "hydra.sweep.dir=")
    kept = [arg for arg in sys.argv[1:] if not arg.lstrip("+~").startswith(pinned)]
    return [sys.executable, *program, *kept, f"hydra.sweep.dir={sweep_dir}", f"{PREFIX}.controller=here"]


class Busy(ConfigError):
    """The study's controller is alive: this one would run its trials a second time."""

    def __init__(self, sweep_dir: Path, busy: run_claim.RunDirBusy) -> None:
        claim = busy.claim
        stop = f"scancel {claim.slurm_job}" if claim.slurm_job else f"kill {claim.pid} on {claim.host}"
        started = f", started by: {claim.command}" if claim.command else ""
        super().__init__(
            "hydra.sweep.dir",
            f"the study in {sweep_dir} already has a live controller: {claim.describe()}"
            f" ({claim.how or 'how it runs is not recorded'}{started}); {busy.why}. A second one would start its"
            " trials twice.",
            f"follow it with `hpc-train-report {sweep_dir} --watch`, or stop it ({stop}) and run this command again"
            " to go on with the study.",
        )


class Placement:
    """The study's controller: refused here while another is alive; run here, or started elsewhere and said."""

    def __init__(self, sweep_dir: Path, settings: TuneSettings) -> None:
        self.sweep_dir = Path(sweep_dir).absolute()
        self.settings = settings
        self.token = os.environ.get(TOKEN_VARIABLE)  # a parent claimed the study for this process
        self.refuse_live()

    def refuse_live(self) -> None:
        try:
            run_claim.check_free(self.sweep_dir, self.token)
        except run_claim.RunDirBusy as busy:
            raise Busy(self.sweep_dir, busy) from None

    def check(self) -> None:
        """What cannot work where the controller is to run, refused before anything starts."""
        where = ELSEWHERE.get(self.settings.controller)
        if where is not None and where.needs and shutil.which(where.needs) is None:
            raise ConfigError(
                f"{PREFIX}.controller",
                f"controller={self.settings.controller} runs the study's controller {where.runs}, but"
                f" `{where.needs}` is not on PATH here.",
                f"{where.fix}, or use {PREFIX}.controller={FORWARDED} (a background process on this machine).",
            )

    def forward(self, job: Any, hydra_cfg: Any) -> None:
        """With cluster.login (a laptop) and trials that queue on the cluster: the same command run by the cluster's
        hpc-train (synced, checked there again), its controller detached there (or a Slurm job, with
        controller=slurm), so that a dropped connection or a closed laptop stops nothing; raises Forwarded."""
        if self.token or job.get("dry_run") or not forwarding.wanted(job):
            return
        where = self.settings.controller if self.settings.controller in ELSEWHERE else FORWARDED
        forwarding.run_on_cluster(job, self.sweep_dir, hydra_cfg, multirun=True, also=[f"{PREFIX}.controller={where}"])

    @contextmanager
    def held(self) -> Iterator[None]:
        """This process is the study's controller while the block runs (its claim refreshed, released after)."""
        token = self.token or run_claim.new_token()
        taken_over = run_claim.acquire(
            self.sweep_dir, token, command=shlex.join(user_command()), how="in the foreground"
        )
        if taken_over:
            print(f"hpc-train: {taken_over}", flush=True)
        keeper = run_claim.Keeper(self.sweep_dir, token).start()
        try:
            yield
        finally:
            keeper.stop()
            run_claim.release(self.sweep_dir, token)

    def start_elsewhere(self, job: Any) -> bool:
        """controller=detached or slurm: the controller started, claimed for it and said (True); here: False."""
        where = ELSEWHERE.get(self.settings.controller)
        if where is None or self.token:
            return False
        self.check()
        self.refuse_live()  # again: the checks took a while
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        token, log = run_claim.new_token(), self.sweep_dir / LOG
        taken_over, started, stop = where.start(self, job, token, log)
        if taken_over:
            print(f"hpc-train: {taken_over}", flush=True)
        print(
            f"hpc-train: the study's controller runs {started}; this command returns, closing the terminal stops"
            f" nothing.\n  study: {self.sweep_dir}\n  its output: {log}\n  follow it: hpc-train-report"
            f" {self.sweep_dir} --watch\n  stop it: {stop} (the same command starts it again, and the study goes on)",
            flush=True,
        )
        return True

    def _start_detached(self, job: Any, token: str, log: Path) -> Tuple[Optional[str], str, str]:
        """The controller as a process of its own session, claimed for it; (a claim taken over, where it runs, how
        to stop it)."""
        env = {TOKEN_VARIABLE: token, "PYTHONUNBUFFERED": "1"}
        child = cli_child.background(_child_command(self.sweep_dir), log, env=env, append=True)
        how = f"detached, its output in {log}"
        command = shlex.join(user_command())
        taken_over = run_claim.acquire(self.sweep_dir, token, pid=child.pid, command=command, how=how)
        return taken_over, f"as process {child.pid} of its own session", f"kill {child.pid}"

    def _start_slurm_job(self, job: Any, token: str, log: Path) -> Tuple[Optional[str], str, str]:
        """The controller as a Slurm job of its own, claimed for it; as _start_detached."""
        job_id = self._submit(job, token, log)
        how = f"as Slurm job {job_id}, its output in {log}"
        command = shlex.join(user_command())
        taken_over = run_claim.acquire(self.sweep_dir, token, slurm_job=job_id, command=command, how=how)
        return taken_over, f"as Slurm job {job_id}", f"scancel {job_id}"

    def _submit(self, job: Any, token: str, log: Path) -> str:
        """The controller's Slurm job: one task, SLURM_CPUS CPUs, no GPU, the profile's partition and account."""
        script = self.sweep_dir / SBATCH_SCRIPT
        rundir.write_text_atomic(script, self._script(job, token, log))
        done = slurm_cli.run(["sbatch", "--parsable", str(script)])
        if done.returncode != 0:
            raise ConfigError(
                f"{PREFIX}.controller",
                f"sbatch refused the controller's job ({script}): {(done.stderr or done.stdout).strip()}",
                f"fix what Slurm says (cluster.partition, cluster.account, {PREFIX}.controller_time), or use"
                f" {PREFIX}.controller=detached.",
            )
        return done.stdout.strip().split(";")[0]

    def _cluster_options(self, job: Any) -> Dict[str, Optional[str]]:
        """The profile's partition, account (or its account_env) and QoS (by the controller's time limit) for the
        controller's job; none for a Hydra app's config, which has no cluster profile."""
        cluster = OmegaConf.select(job, "cluster", default=None)
        if cluster is None:
            return {}
        try:
            qos = cluster_qos(cluster, self.settings.controller_minutes)
        except ConfigError as err:
            raise ConfigError(f"{PREFIX}.controller_time", err.problem, "ask for less, or pass cluster.qos.") from None
        partition = cluster.get("partition")
        return {"partition": partition and str(partition), "account": cluster_account(cluster), "qos": qos}

    def _script(self, job: Any, token: str, log: Path) -> str:
        options = [
            "--job-name=hpc-train-controller",
            "--nodes=1",
            "--ntasks=1",
            f"--cpus-per-task={SLURM_CPUS}",
            f"--time={self.settings.controller_minutes}",
            f"--output={log}",
            "--open-mode=append",
        ]
        options += [f"--{key}={value}" for key, value in self._cluster_options(job).items() if value]
        setup = [str(line) for line in OmegaConf.select(job, "cluster.setup", default=None) or []]
        # the controller's own allocation is not its trials': sbatch and srun in them must not read its variables
        unset = 'for v in $(compgen -e | grep "^SLURM_" | grep -v "^SLURM_CONF$"); do unset "$v"; done'
        lines = ["#!/bin/bash", *(f"#SBATCH {option}" for option in options), unset, *setup]
        lines += [f"cd {shlex.quote(os.getcwd())}", f"export {TOKEN_VARIABLE}={token} PYTHONUNBUFFERED=1"]
        lines.append(f"exec {shlex.join(_child_command(self.sweep_dir))}")
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Elsewhere:
    """A place where the controller runs apart from the command that starts it (``hydra.sweeper.controller``)."""

    start: Callable[[Placement, Any, str, Path], Tuple[Optional[str], str, str]]
    runs: str  # how it runs there, in words
    needs: Optional[str] = None  # a command it needs on PATH here
    fix: str = ""  # where to run the command when that command is missing


# Where a controller runs other than here (settings.CONTROLLERS: these and "here", this command itself)
ELSEWHERE: Dict[str, Elsewhere] = {
    "detached": Elsewhere(Placement._start_detached, "as a background process"),
    "slurm": Elsewhere(Placement._start_slurm_job, "as a Slurm job", "sbatch", "run the command on a Slurm login node"),
}
FORWARDED = "detached"  # where a laptop's study's controller runs on the cluster, unless it asked for another place
