"""The adaptive sweep's controller: asks Optuna for trials, runs their rungs, fills a free slot at once.

One loop, every ``poll_s``: look at each running rung (its job ended with a summary, failed, or still runs); a finished
rung's objective goes into the journal, and the trial pauses there or completes; then every free slot gets the
scheduler's next action (a promotion, resuming the trial's checkpoint, or a new trial). Trials that cannot resume (the
trials' ``resumes``) take the scheduler's stopping form: each runs its full budget in one job, judged at each rung as
its reports reach the rung's budget, and stopped there (its job cancelled) when it ranks poorly. All state is the
journal (hpc_train.jobs.study): a controller started again on the same sweep dir adopts the rungs still running and
goes on, so no trial is lost or started twice. At the end the paused trials are stopped (PRUNED to Optuna) and the
best is said; past ``max_failures`` failed trials the study stops with one message.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from hpc_train.errors import ConfigError, HpcTrainError, JobFailed, Unreachable
from hpc_train.jobs import study as names
from hpc_train.tune import scheduler as sched
from hpc_train.tune.settings import TuneSettings
from hpc_train.tune.space import SearchSpace, grid
from hpc_train.tune.trials import DONE, FAILED, LOST, RUNNING, HpcTrainTrials, began, ran_for

log = logging.getLogger("hpc_train")
STARTED = "started"  # a trial's attribute: when its current rung was started (epoch seconds)


class Controller:
    def __init__(
        self,
        settings: TuneSettings,
        space: SearchSpace,
        trials: HpcTrainTrials,
        sweep_dir: Path,
        value_of: Callable[[Path], float],
    ) -> None:
        self.settings, self.space, self.trials = settings, space, trials
        self.sweep_dir = Path(sweep_dir)
        self.value_of = value_of  # a finished rung's objective, from its run dir (JobFailed when there is none)
        self.scheduler = sched.Scheduler(settings.scheduler, settings.direction)
        self.storage: Any = None
        self.study: Any = None

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        """The study to its end; returns the best trial's number, value and parameters."""
        self._open()
        while self._step():
            time.sleep(self.settings.poll_s)
        return self._finish()

    def _step(self) -> bool:
        """One look at the running rungs, then the free slots filled; False once nothing runs and nothing is left."""
        for trial in self._trials():
            if trial.user_attrs.get(names.STATUS) in (None, sched.RUNNING):
                self._look(trial)
        self._check_failures()
        views = self._views()
        running = sum(view.status == sched.RUNNING for view in views)
        while running < self.settings.max_concurrent:
            action = self.scheduler.next_action(views, len(views), self.settings.max_trials)
            if action is None:
                break
            self._act(action)
            views, running = self._views(), running + 1
        return running > 0

    # -- the journal ----------------------------------------------------------------------------
    def _open(self) -> None:
        import optuna  # the tune extra: only an adaptive sweep's controller needs it

        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage = names.storage(self.sweep_dir)
        self.study = optuna.create_study(
            storage=self.storage,
            study_name=names.STUDY_NAME,
            direction=self.settings.direction,
            sampler=self._sampler(),
            load_if_exists=True,
        )
        asked = {"settings": repr(self.settings), "space": repr(sorted(self.space.distributions.items()))}
        held = self.study.user_attrs.get(names.SETTINGS)
        if held is None:
            self.study.set_user_attr(names.SETTINGS, asked)
        elif held != asked:
            raise ConfigError(
                "hydra.sweep.dir",
                f"{self.sweep_dir} holds a study of other settings or another search space ({held}).",
                "run the same command line to go on with that study, or give this one a new hydra.sweep.dir.",
            )
        s = self.settings
        info = {"direction": s.direction, "objective": s.objective, "resource_key": s.scheduler.resource_key}
        info.update(budgets=list(self.scheduler.budgets), max_trials=s.max_trials, max_concurrent=s.max_concurrent)
        if self.study.user_attrs.get(names.INFO) != info:  # for hpc-train-report (jobs.study.INFO)
            self.study.set_user_attr(names.INFO, info)

    def _sampler(self) -> Any:
        import optuna  # the tune extra (see _open)

        name, seed = self.settings.sampler, self.settings.seed
        if name == "grid":
            return _grid_sampler(optuna, grid(self.space), seed)
        classes = {
            "tpe": optuna.samplers.TPESampler,
            "random": optuna.samplers.RandomSampler,
            "cmaes": optuna.samplers.CmaEsSampler,
            "qmc": optuna.samplers.QMCSampler,
            "gp": optuna.samplers.GPSampler,
            "nsgaii": optuna.samplers.NSGAIISampler,
            "bruteforce": optuna.samplers.BruteForceSampler,
        }
        if name not in classes:
            choices = ", ".join(["grid", *classes])
            raise ConfigError("hydra.sweeper.sampler", f"{name!r} is no sampler.", f"pick one of {choices}.")
        return classes[name](seed=seed)

    def _trials(self) -> List[Any]:
        return self.study.get_trials(deepcopy=False)

    def _trial_id(self, number: int) -> int:
        study_id = self.storage.get_study_id_from_name(names.STUDY_NAME)
        return self.storage.get_trial_id_from_study_id_trial_number(study_id, number)

    def _set(self, number: int, **attrs: Any) -> None:
        trial_id = self._trial_id(number)
        for key, value in attrs.items():
            self.storage.set_trial_user_attr(trial_id, key, value)

    def _views(self) -> List[sched.TrialView]:
        views = []
        for trial in self._trials():
            attrs = trial.user_attrs
            values = {int(rung): float(value) for rung, value in (attrs.get(names.RUNG_VALUES) or {}).items()}
            status = attrs.get(names.STATUS) or sched.RUNNING  # asked, its first rung not yet started: runs now
            bracket = int(attrs.get(names.BRACKET, self.scheduler.bracket_of(trial.number)))
            views.append(sched.TrialView(trial.number, bracket, int(attrs.get(names.RUNG, 0)), status, values))
        return views

    # -- a rung ---------------------------------------------------------------------------------
    def _act(self, action: sched.Action) -> None:
        if action.kind == sched.NEW:
            trial = self.study.ask(fixed_distributions=self.space.distributions)
            self._set(trial.number, **{names.BRACKET: action.bracket, names.RUNG: action.rung})
            number = trial.number
        else:
            number = int(action.trial)  # type: ignore[arg-type]
            log.info("hpc-train: trial %d promoted to rung %d", number, action.rung)
        self._start_rung(number, action.rung)

    def _start_rung(self, number: int, rung: int) -> None:
        """The trial's rung, started in its run dir (a promotion resumes the checkpoint the last rung left there)."""
        trial = self._trials()[number]  # numbered from 0 in the order asked
        run_dir = self.sweep_dir / str(number)
        overrides = self.space.overrides(trial.params)
        budget = self.scheduler.budgets[-1 if self._stops() else rung]  # the stopping form: the full budget at once
        key = self.settings.scheduler.resource_key
        if key and budget is not None:
            overrides.append(f"{key}={budget}")
        started = time.time()
        times = {**(trial.user_attrs.get(names.RUNG_TIMES) or {}), str(rung): [started, None]}
        attrs = {names.STATUS: sched.RUNNING, names.RUNG: rung, names.JOB: None, STARTED: started}
        self._set(number, **attrs, **{names.RUN_DIR: str(run_dir), names.RUNG_TIMES: times})
        try:
            job_id = self.trials.start(overrides, run_dir)
        except Unreachable as err:  # Slurm (or the cluster) did not answer: the next look starts the rung again
            log.warning(
                "hpc-train: trial %d rung %d not started, tried again in %g s: %s",
                number,
                rung,
                self.settings.poll_s,
                err,
            )
            return
        except HpcTrainError as err:  # its overrides refused, or its job not queued: a failed trial
            self._failed(number, str(err))
            return
        self._set(number, **{names.JOB: job_id})
        log.info("hpc-train: trial %d rung %d (%s=%s): job %s in %s", number, rung, key, budget, job_id, run_dir)

    def _look(self, trial: Any) -> None:
        attrs = trial.user_attrs
        # asked, or its rung's attributes half written (killed between two of them), by a controller that stopped
        # before it started the rung's job
        if attrs.get(names.STATUS) is None or names.RUN_DIR not in attrs:
            self._start_rung(trial.number, int(attrs.get(names.RUNG, 0)))
            return
        run_dir, job_id = Path(attrs[names.RUN_DIR]), attrs.get(names.JOB)
        since = float(attrs.get(STARTED, 0.0))
        look = self.trials.look(job_id, run_dir, since)
        if self._stops() and look.state in (RUNNING, DONE) and not self._judge(trial.number, run_dir, since):
            return  # stopped at a rung, its job cancelled
        if look.state == RUNNING:
            return
        if look.state == LOST:  # its job ended without finishing the rung (or never started): run it again
            self._start_rung(trial.number, int(attrs[names.RUNG]))
            return
        if look.state == FAILED:
            self._failed(trial.number, look.error or "failed")
            return
        if self._stops():
            self._ran_through(trial.number, run_dir, since)
            return
        try:
            value = self.value_of(run_dir)
        except JobFailed as err:
            self._failed(trial.number, str(err))
            return
        self._rung_done(trial, value, since, ran_for(run_dir, since))

    def _rung_done(
        self,
        trial: Any,
        value: float,
        started: float,
        seconds: float,
        status: Optional[str] = None,
        ended: Optional[float] = None,
    ) -> None:
        """The rung's objective recorded (an intermediate value at its budget), with the seconds its job ran and when
        it was started and seen to end (`ended`: when it ended, if known); the trial pauses there, or completes at the
        last rung (`status`: the stopping form's, which never pauses)."""
        from optuna.trial import TrialState  # the tune extra (see _open)

        attrs, number = trial.user_attrs, trial.number
        rung = int(attrs[names.RUNG])
        values = {**(attrs.get(names.RUNG_VALUES) or {}), str(rung): value}
        spent = {**(attrs.get(names.RUNG_SECONDS) or {}), str(rung): seconds}
        times = {**(attrs.get(names.RUNG_TIMES) or {}), str(rung): [started, ended or time.time()]}
        budget = self.scheduler.budgets[rung]
        step = int(budget if budget is not None else rung)
        self.storage.set_trial_intermediate_value(self._trial_id(number), step, value)
        last = self.scheduler.is_last(rung)
        status = sched.COMPLETED if last else status or sched.PAUSED
        self._set(number, **{names.RUNG_VALUES: values, names.RUNG_SECONDS: spent, names.RUNG_TIMES: times})
        self._set(number, **{names.STATUS: status})
        if last:
            self.study.tell(number, value, state=TrialState.COMPLETE)
        log.info("hpc-train: trial %d rung %d: %s = %g (%s)", number, rung, "objective", value, status)

    # -- the stopping form: trials that cannot pause ----------------------------------------------
    def _stops(self) -> bool:
        """The trials cannot resume a rung (a script job without script.resume_args): each runs its full budget in
        one job, judged at each rung as its reports reach it (the scheduler's stopping form)."""
        return not getattr(self.trials, "resumes", True)

    def _judge(self, number: int, run_dir: Path, since: float) -> bool:
        """Each rung before the last whose budget the trial's reports have reached, recorded and judged
        (Scheduler.goes_on); at the first where it does not go on, it is stopped there and its job cancelled. False
        when it was stopped."""
        attrs = self._trials()[number].user_attrs
        reports = self.trials.reported(run_dir, since)
        for rung, value, at in sched.rungs_reached(reports, self.scheduler.budgets, int(attrs[names.RUNG])):
            if self.scheduler.is_last(rung):
                break
            start = self._rung_start(number, rung, run_dir, since)
            self._rung_done(self._trials()[number], value, start, at - start, status=sched.RUNNING, ended=at)
            if not self.scheduler.goes_on(self._views(), number, rung):
                self._stop(number, rung)
                return False
            times = {**(self._trials()[number].user_attrs.get(names.RUNG_TIMES) or {}), str(rung + 1): [at, None]}
            self._set(number, **{names.RUNG: rung + 1, names.RUNG_TIMES: times})
        return True

    def _rung_start(self, number: int, rung: int, run_dir: Path, since: float) -> float:
        """When the rung began: the last rung's report, or for the job's first, its attempt's start."""
        times = self._trials()[number].user_attrs.get(names.RUNG_TIMES) or {}
        return max(float((times.get(str(rung)) or [since])[0]), began(run_dir, since))

    def _stop(self, number: int, rung: int) -> None:
        from optuna.trial import TrialState  # the tune extra (see _open)

        job_id = self._trials()[number].user_attrs.get(names.JOB)
        # stopped before its job is cancelled: a controller killed between the two leaves a job that runs out, not a
        # cancelled one taken for a failure
        self._set(number, **{names.STATUS: sched.STOPPED})
        self.study.tell(number, state=TrialState.PRUNED, skip_if_finished=True)
        if job_id:
            self.trials.cancel([job_id])
        log.info("hpc-train: trial %d stopped at rung %d: job %s cancelled", number, rung, job_id)

    def _ran_through(self, number: int, run_dir: Path, since: float) -> None:
        """The trial's job ran its full budget: its value there (its report at max_resource, or without one the
        summary's objective) completes it at the last rung."""
        attrs, last = self._trials()[number].user_attrs, len(self.scheduler.budgets) - 1
        reports = self.trials.reported(run_dir, since)
        reached = {rung: value for rung, value, _ in sched.rungs_reached(reports, self.scheduler.budgets, last)}
        try:
            value = reached[last] if last in reached else self.value_of(run_dir)
        except JobFailed as err:
            self._failed(number, str(err))
            return
        rung, times = int(attrs[names.RUNG]), dict(attrs.get(names.RUNG_TIMES) or {})
        start = self._rung_start(number, rung, run_dir, since)
        if rung != last:  # its reports reached no budget of the rungs between (a script that reports at the end)
            times.pop(str(rung), None)
            self._set(number, **{names.RUNG: last, names.RUNG_TIMES: times})
        ended = began(run_dir, since) + ran_for(run_dir, since)
        self._rung_done(self._trials()[number], value, start, ended - start, ended=ended)

    def _failed(self, number: int, error: str) -> None:
        from optuna.trial import TrialState  # the tune extra (see _open)

        attrs = self._trials()[number].user_attrs
        times = dict(attrs.get(names.RUNG_TIMES) or {})
        rung = str(attrs.get(names.RUNG, 0))
        if rung in times:  # seen to end now
            times[rung] = [times[rung][0], time.time()]
        self._set(number, **{names.STATUS: sched.FAILED, names.ERROR: error, names.RUNG_TIMES: times})
        self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        log.warning("hpc-train: trial %d failed: %s", number, error)

    def _check_failures(self) -> None:
        failed = [t for t in self._trials() if t.user_attrs.get(names.STATUS) == sched.FAILED]
        if len(failed) <= self.settings.max_failures:
            return
        running = [t.user_attrs for t in self._trials() if t.user_attrs.get(names.STATUS) == sched.RUNNING]
        self.trials.cancel([attrs[names.JOB] for attrs in running if attrs.get(names.JOB)])
        last = failed[-1]
        raise JobFailed(
            f"the study stopped: {len(failed)} trials failed, more than hydra.sweeper.max_failures="
            f"{self.settings.max_failures}; the last (trial {last.number}): {last.user_attrs.get(names.ERROR)}",
            run_dir=self.sweep_dir,
        )

    # -- the end --------------------------------------------------------------------------------
    def _finish(self) -> Dict[str, Any]:
        from optuna.trial import TrialState  # the tune extra (see _open)

        for trial in self._trials():
            if trial.user_attrs.get(names.STATUS) == sched.PAUSED:
                self._set(trial.number, **{names.STATUS: sched.STOPPED})
                self.study.tell(trial.number, state=TrialState.PRUNED, skip_if_finished=True)
        complete = [t for t in self._trials() if t.state == TrialState.COMPLETE]
        if not complete:
            raise JobFailed(f"the study ended with no completed trial; see {self.sweep_dir}", run_dir=self.sweep_dir)
        best = self.study.best_trial
        return {"number": best.number, "value": best.value, "params": dict(best.params)}


def _grid_sampler(optuna: Any, values: Dict[str, List[Any]], seed: Any) -> Any:
    """Optuna's grid sampler, which would stop the study once its grid is used up: Study.stop works only inside
    Study.optimize, and raised here on the last trial's tell; this controller ends the study at max_trials."""

    class StudyGrid(optuna.samplers.GridSampler):
        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return StudyGrid(values, seed=seed)
