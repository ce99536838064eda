"""Which trial a free slot runs next: ASHA's promotions, Hyperband's brackets, or every trial to its full budget.

A trial trains rung by rung; rung k's budget is ``max_resource // eta**(K-k)``, the last rung's is ``max_resource``
(K: how many times eta fits between min_resource and max_resource). When a trial has finished a rung it pauses there,
its checkpoint on disk. A free slot then goes, in this order (asynchronous successive halving, Li et al. 2020):

1. to a paused trial in the best ``floor(n / eta)`` of the ``n`` trials that finished its rung, highest rung first:
   it is promoted, and resumes from its checkpoint with the next rung's budget;
2. else to a new trial, at the first rung of its bracket, while the study has trials left to start;
3. else, once every trial has started and none runs or completed, to the best paused trial of the highest rung
   reached, so that a study always ends with a trial trained to the full budget (successive halving's last
   promotion).

``asha`` has one bracket. ``hyperband`` has K+1, bracket b starting at rung b (bracket 0 stops the most, bracket K
none); trial n goes to bracket ``n mod (K+1)``, and promotions stay within a bracket. ``none`` runs every trial at
``max_resource`` (or the trial's own length without a resource key) in one rung. Failed trials rank nowhere. Pure:
it reads the trials as data and says what to do; the controller does it.

A trial that cannot pause (a script job without ``script.resume_args``: promoted, it would start over) takes ASHA's
stopping form instead: it runs its full budget in one job, and as it reaches each rung's budget, :meth:`goes_on`
says whether it goes on: if it ranks among the best ``max(1, floor(n / eta))`` of the ``n`` trials of its bracket
that reached the rung, itself included; else it is stopped there. Such a trial never pauses, so none is promoted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

from hpc_train.tune.settings import SchedulerSettings

RUNNING, PAUSED, COMPLETED, FAILED, STOPPED = "running", "paused", "completed", "failed", "stopped"
STATUSES = (RUNNING, PAUSED, COMPLETED, FAILED, STOPPED)
PROMOTE, NEW = "promote", "new"


@dataclass(frozen=True)
class TrialView:
    number: int
    bracket: int
    rung: int  # the rung it runs, or the last it finished
    status: str  # one of STATUSES
    values: Mapping[int, float]  # rung -> the objective there


@dataclass(frozen=True)
class Action:
    kind: str  # PROMOTE or NEW
    rung: int  # the rung to run
    bracket: int
    trial: Optional[int] = None  # PROMOTE: the trial's number


def budgets(settings: SchedulerSettings) -> List[Optional[int]]:
    """Each rung's value of the resource key; [max_resource] (or [None]: the trial's own) without a scheduler."""
    if settings.name == "none":
        return [settings.max_resource]
    top = int(settings.max_resource or 0)
    steps = 0
    while settings.min_resource * settings.eta ** (steps + 1) <= top:
        steps += 1
    return [top // settings.eta ** (steps - k) for k in range(steps + 1)]


def rungs_reached(
    reports: Sequence[Tuple[int, float, float]], budgets: Sequence[Optional[int]], rung: int
) -> List[Tuple[int, float, float]]:
    """The stopping form: (rung, value, time) of each rung from `rung` on whose budget a running trial's reports
    (step, value, time; in order) have reached: a rung's value and time are the first report's at a step at or past
    its budget. A budget of None (the trial's own length, without a resource key) is reached only by its end."""
    reached = []
    for number in range(rung, len(budgets)):
        budget = budgets[number]
        first = None if budget is None else next((report for report in reports if report[0] >= budget), None)
        if first is None:
            break
        reached.append((number, first[1], first[2]))
    return reached


class Scheduler:
    def __init__(self, settings: SchedulerSettings, direction: str) -> None:
        self.budgets = budgets(settings)
        self.eta = settings.eta
        self.brackets = len(self.budgets) if settings.name == "hyperband" else 1
        self.sign = 1.0 if direction == "minimize" else -1.0

    def bracket_of(self, number: int) -> int:
        return number % self.brackets

    def is_last(self, rung: int) -> bool:
        return rung == len(self.budgets) - 1

    def next_action(self, trials: Sequence[TrialView], started: int, max_trials: int) -> Optional[Action]:
        """What a free slot runs now; None: nothing (wait for a running trial, or the study is done)."""
        for bracket in range(self.brackets):
            promotion = self._promotion(trials, bracket)
            if promotion is not None:
                return promotion
        if started < max_trials:
            bracket = self.bracket_of(started)
            return Action(NEW, rung=bracket if self.brackets > 1 else 0, bracket=bracket)
        if any(t.status == RUNNING for t in trials):
            return None
        return self._final_promotion(trials)

    def promotable(self, trials: Sequence[TrialView], bracket: int, rung: int) -> List[TrialView]:
        """The paused trials of `bracket` at `rung` in the best floor(n / eta) of the n that finished it, best first."""
        finished = [t for t in trials if t.bracket == bracket and rung in t.values and t.status != FAILED]
        ranked = sorted(finished, key=lambda t: (self.sign * t.values[rung], t.number))
        top = ranked[: len(ranked) // self.eta]
        return [t for t in top if t.status == PAUSED and t.rung == rung]

    def goes_on(self, trials: Sequence[TrialView], number: int, rung: int) -> bool:
        """The stopping form: trial `number`, running, has reached `rung` (its value there among its values); True
        if it ranks among the best max(1, floor(n / eta)) of the n trials of its bracket that reached the rung (itself
        included), so that it trains on; False: it stops there. The first to reach a rung always goes on."""
        bracket = next(t.bracket for t in trials if t.number == number)
        reached = [t for t in trials if t.bracket == bracket and rung in t.values and t.status != FAILED]
        ranked = sorted(reached, key=lambda t: (self.sign * t.values[rung], t.number))
        return any(t.number == number for t in ranked[: max(1, len(ranked) // self.eta)])

    def _promotion(self, trials: Sequence[TrialView], bracket: int) -> Optional[Action]:
        for rung in range(len(self.budgets) - 2, -1, -1):
            ready = self.promotable(trials, bracket, rung)
            if ready:
                return Action(PROMOTE, rung=rung + 1, bracket=bracket, trial=ready[0].number)
        return None

    def _final_promotion(self, trials: Sequence[TrialView]) -> Optional[Action]:
        """Every trial started, none runs and none completed: the best paused trial of the highest rung goes on, so
        that a study always ends with a trial trained to the full budget."""
        paused = [t for t in trials if t.status == PAUSED and not self.is_last(t.rung)]
        if not paused or any(t.status == COMPLETED for t in trials):
            return None
        top = max(t.rung for t in paused)
        best = min((t for t in paused if t.rung == top), key=lambda t: (self.sign * t.values[top], t.number))
        return Action(PROMOTE, rung=top + 1, bracket=best.bracket, trial=best.number)
