"""An adaptive study's trials run in packed allocations (``launcher.pack.*`` set, as for a packed sweep).

The allocations are submitted once, before the first rung, with empty plans (hpc_train.launch.backends.slurm.packed
.plan_fed), and fed: each rung the controller starts is laid out here as the job of a sweep is (its config composed,
checked, its job spec written into the trial's run dir), then dropped into the sweep's feed (hpc_train.pack.feed),
where the first allocation with room for it claims it and runs it as a job step of its pool. So at most the
allocations' slots run at once, and each step has its own GPUs (the pool's first fit). A rung's id is
``<trial>-<n>``: the trial's n-th fed rung, a packed run of its own in the allocations' records.

What a rung runs is the trials' own (`Rungs`): an hpc-train job's worker reading its job spec (HpcTrainRungs), or a
Hydra app's task run by hpc_train.pack.app_step (hpc_train.tune.app_packed.AppRungs); the feeding and the looks are
one mechanism for both.

A look reads the pack's records (hpc_train.pack.status): a run COMPLETED is DONE (the controller reads its objective
from the run dir, as for any rung), FAILED is FAILED (its first rank error, or Slurm's refusal of its step), a run its
allocation never finished or stopped (cancelled, out of time: its step killed by the allocation's signal) is LOST, so
the controller feeds it again and it resumes its checkpoint. A run fed while no allocation is left stops the study
with the fix in words. A controller started again on the sweep dir adopts the live allocations (their rungs run on)
and submits new ones only when none is left. At the study's end the feed is closed: each pool ends once its steps
have ended.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from hpc_train.config.launcher import launcher_kind
from hpc_train.errors import ConfigError, JobFailed
from hpc_train.jobs import job_states
from hpc_train.launch.backends.slurm import packed as pack
from hpc_train.launch.backends.slurm import params as slurm_params
from hpc_train.launch.backends.slurm import submit as slurm
from hpc_train.launch.hydra.sweep_configs import SweepConfigs
from hpc_train.launch.planning.jobspec import build_job_spec, write_job_spec, write_yaml
from hpc_train.launch.planning.plan import make_plan
from hpc_train.pack import feed, records, status
from hpc_train.pack.records import AllocationPlan, PackedRun
from hpc_train.records import rundir
from hpc_train.slurm import slurm_cli
from hpc_train.tune.trials import DONE, FAILED, LOST, RUNNING, Look

READ_EVERY_S = 0.5  # one reading of the allocations' records (and Slurm's states) serves the looks of one poll


def packed_trials(job: DictConfig, loader: Any, config: DictConfig, fixed: Sequence[str]) -> Optional["PackedTrials"]:
    """The study's trials when its job config is packed (launcher.pack.allocations set, a launcher that queues on
    Slurm); None otherwise. (From a laptop, cluster.login, the whole study went to the cluster before this, where the
    allocations see the sweep dir the controller feeds them through: hpc_train.tune.placement.)"""
    if OmegaConf.select(job, "launcher.pack.allocations") is None or not launcher_kind(job.launcher.name).submits:
        return None
    sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
    return PackedTrials(HpcTrainRungs(SweepConfigs(loader, config).resolved, fixed, sweep_dir), sweep_dir)


@dataclasses.dataclass(frozen=True)
class Allocations:
    """What the study's fed allocations are made of: their shape, a rung as every rung is (the trials' fixed part) and
    its sbatch parameters, the signal their pools forward, and the keys their refusals name."""

    shape: pack.PackShape
    template: PackedRun
    params: Dict[str, Any]
    max_requeues: int
    signal: str
    signal_delay_s: int
    keys: pack.PackKeys = pack.PackKeys()
    shared: Sequence[str] = pack.SHARED


class Rungs(Protocol):
    """What a study's rungs run, laid out for the feed."""

    allocations: Allocations

    def lay_out(self, overrides: List[str], run_dir: Path, key: str) -> Tuple[PackedRun, Dict[str, Any]]:
        """The rung as packed run `key` (what its step reads written), with its sbatch parameters."""

    def logs(self, key: str, run_dir: Path) -> Path:
        """Where a failed rung's logs are."""


class HpcTrainRungs:
    """hpc-train's rungs: each a job whose config is composed and checked, its job spec in the trial's run dir."""

    def __init__(self, compose: Callable[[List[str], int], Any], fixed: Sequence[str], sweep_dir: Path) -> None:
        """`compose`: a rung's checked config for its overrides and trial number (a JobConfig with .view, .choices,
        as hpc_train.launch.hydra.sweep_configs.SweepConfigs.resolved gives it); `fixed`: what every trial gets."""
        self.compose = compose
        first = self._prepare(list(fixed), sweep_dir / "0")
        shape = pack.pack_shape(first.plan.config)
        assert shape is not None  # the sweeper picks these trials only for a packed job config
        config = first.plan.config
        signal, delay = slurm_params.requeue_signal(config), int(config.launcher.signal_delay_s)
        template = study_refusal(lambda: pack.packed_run(first), first.plan.run_dir.name)
        self.allocations = Allocations(shape, template, first.params, first.max_requeues, signal, delay)

    def _prepare(self, overrides: List[str], run_dir: Path) -> slurm.PreparedJob:
        job = self.compose(overrides, int(run_dir.name))
        plan = make_plan(job.view, run_dir)
        return slurm.prepare(plan, build_job_spec(plan, job.choices), " ".join(overrides))

    def lay_out(self, overrides: List[str], run_dir: Path, key: str) -> Tuple[PackedRun, Dict[str, Any]]:
        prepared = self._prepare(overrides, run_dir)
        run = pack.packed_run(prepared)
        write_job_spec(prepared.spec, run_dir)
        (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
        write_yaml(overrides, run_dir / ".hydra" / "overrides.yaml")
        return dataclasses.replace(run, job=key), prepared.params

    def logs(self, key: str, run_dir: Path) -> Path:
        return run_dir / rundir.LOGS


def study_refusal(make: Callable[[], Any], number: str) -> Any:
    """What `make` returns; its refusal said of the study's trials, not of a sweep job."""
    try:
        return make()
    except ConfigError as err:
        problem = err.problem.replace(f"sweep job #{number} ", "the study's trials ")
        raise ConfigError(err.key, problem, err.fix) from None


class PackedTrials:
    def __init__(self, rungs: Rungs, sweep_dir: Path) -> None:
        self.rungs, self.sweep_dir = rungs, Path(sweep_dir).absolute()
        fed = rungs.allocations
        study_refusal(lambda: pack.check_packed_fit([fed.template], [fed.params], fed.shape, fed.keys, fed.shared), "0")
        self._read_at, self._status = -math.inf, status.PackStatus({}, {}, {})
        self.allocations: Optional[List[AllocationPlan]] = None  # adopted or submitted at the first start or look

    # -- the allocations --------------------------------------------------------------------------
    def _adopt_or_submit(self) -> List[AllocationPlan]:
        """The fed allocations still live in the sweep dir (a controller started again), else new ones, queued."""
        if feed.is_closed(self.sweep_dir):  # an ended study's dir, going on: its feed opens again
            (feed.folder(self.sweep_dir) / feed.CLOSED).unlink()
        live = self._live(status.read(self.sweep_dir))
        if live:
            print(f"hpc-train: the study goes on in its packed allocations {', '.join(str(p.job_id) for p in live)}")
            return live
        fed = self.rungs.allocations
        plans = pack.plan_fed(
            fed.template,
            fed.params,
            fed.max_requeues,
            fed.shape,
            self.sweep_dir,
            fed.signal,
            fed.signal_delay_s,
            fed.keys,
            fed.shared,
        )
        submitted = pack.submit(plans, self.sweep_dir)
        print(
            f"hpc-train: the study's rungs run in {len(submitted)} packed allocation(s):"
            f" {', '.join(str(plan.job_id) for plan in submitted)}"
        )
        return submitted

    def _ensure_allocations(self) -> None:
        """At this controller's first start or look: the allocations adopted, or submitted (a study going on after
        its allocations ended gets new ones before its waiting rungs are looked at)."""
        if self.allocations is None:
            self.allocations = self._adopt_or_submit()
            self._read_at = -math.inf  # the next look reads the new plans

    def _live(self, now: status.PackStatus) -> List[AllocationPlan]:
        return [
            plan
            for plan in now.plans
            if plan.fed
            and plan.job_id
            and now.allocations.get(str(plan.job_id)) not in job_states.ENDED
            and not records.finished(self.sweep_dir, plan.index)
        ]

    def _read(self) -> status.PackStatus:
        if time.monotonic() - self._read_at > READ_EVERY_S:
            self._status, self._read_at = status.read(self.sweep_dir), time.monotonic()
        return self._status

    # -- a rung -----------------------------------------------------------------------------------
    def start(self, overrides: Sequence[str], run_dir: Path) -> str:
        """The rung laid out (what its step reads written) and fed; its id (ConfigError for a rung that does not fit
        the allocations)."""
        self._ensure_allocations()
        run_dir = Path(run_dir).absolute()
        key = f"{run_dir.name}-{self._fed_count(run_dir.name) + 1}"
        run, params = self.rungs.lay_out(list(overrides), run_dir, key)
        fed = self.rungs.allocations
        pack.check_packed_fit([fed.template, run], [fed.params, params], fed.shape, fed.keys, fed.shared)
        feed.put(self.sweep_dir, run)
        return key

    def _fed_count(self, trial: str) -> int:
        """How many rungs of the trial were fed so far (each leaves its file, in the feed or among the claimed)."""
        where = feed.folder(self.sweep_dir)
        return sum(1 for folder in (where, where / feed.CLAIMED) for _ in folder.glob(f"*_{trial}-*.json"))

    def look(self, job_id: Optional[str], run_dir: Path, since: float) -> Look:
        """The rung now; `job_id` None: the controller that started it stopped before it noted the id: the run fed
        into `run_dir` since `since` is that rung."""
        self._ensure_allocations()
        key = job_id or self._fed_since(Path(run_dir).absolute(), since)
        if key is None:
            return Look(LOST)
        now = self._read()
        state = now.runs.get(key)
        if state is None:
            return self._unclaimed(key, now)
        if state.state == records.COMPLETED:
            return Look(DONE)
        if state.state == records.CANCELLED or (state.state == records.FAILED and self._stopped(key, state)):
            return Look(LOST)  # its allocation ended (or stopped it) before it finished: fed again, it resumes
        if state.state == records.FAILED:
            return Look(FAILED, error=self._failure(key, state, Path(run_dir), since))
        return Look(RUNNING)

    def _stopped(self, key: str, state: records.RunState) -> bool:
        """Whether the run's step was running when its allocation was told to stop (scancel, Slurm's SIGTERM at the
        time limit): its exit is the allocation's end, not the trial's failure."""
        events = records.read_events(self.sweep_dir, state.allocation)
        return any(event.get("event") == "signal" and key in (event.get("running") or []) for event in events)

    def _unclaimed(self, key: str, now: status.PackStatus) -> Look:
        """A rung not in the allocations' records: waiting in the feed, claimed a moment ago, or never fed."""
        waiting = any(entry.run.job == key for entry in feed.waiting(self.sweep_dir))
        taken = [index for index, entry in feed.claimed(self.sweep_dir) if entry.run.job == key]
        if not waiting and not taken:
            return Look(LOST)
        live = self._live(now)
        if taken and not any(plan.index == taken[0] for plan in live):
            return Look(LOST)  # its pool claimed it and ended before it recorded it
        if not live:
            raise JobFailed(
                f"the study's packed allocations ({', '.join(str(p.job_id) for p in now.plans if p.fed)}) have all"
                f" ended (their time, launcher.pack.time or cluster.time, ran out, or they were cancelled), and rung"
                f" {key} waits in {feed.folder(self.sweep_dir)}. Run the same command again: the study goes on in"
                " new allocations (give them more time with launcher.pack.time).",
                run_dir=self.sweep_dir,
            )
        return Look(RUNNING)

    def _fed_since(self, run_dir: Path, since: float) -> Optional[str]:
        entries = [*feed.waiting(self.sweep_dir), *(e for _, e in feed.claimed(self.sweep_dir))]
        fed = [e for e in entries if e.run.job.startswith(f"{run_dir.name}-") and e.fed >= since - 1.0]
        return max(fed, key=lambda e: e.fed).run.job if fed else None

    def _failure(self, key: str, state: records.RunState, run_dir: Path, since: float) -> str:
        packed = records.packed_id(str(state.job_id), key)
        said = records.refusal(state)
        if said:
            return f"packed run {packed} FAILED: {said}"
        rank, error = job_states.first_rank_error(run_dir, since)
        if error:
            return f"packed run {packed} FAILED: rank {rank} failed first ({error}); its traceback: " + str(
                rundir.rank_log(run_dir, rank)
            )
        return f"packed run {packed} FAILED (exit code {state.exit_code}); see {self.rungs.logs(key, run_dir)}"

    # -- the end ----------------------------------------------------------------------------------
    def cancel(self, job_ids: List[str]) -> None:
        """The study stopped: the rungs not yet claimed taken out of the feed, and the allocations (which run only the
        study's rungs) cancelled."""
        feed.withdraw(self.sweep_dir)
        feed.close(self.sweep_dir)
        live = [str(plan.job_id) for plan in self._live(status.read(self.sweep_dir))]
        if live:
            slurm_cli.run(["scancel", *live])

    def close(self) -> None:
        """The study ended: no rung comes any more, and each pool ends once its steps have ended."""
        feed.close(self.sweep_dir)
