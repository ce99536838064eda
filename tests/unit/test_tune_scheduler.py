"""The adaptive sweeper's scheduler (hpc_train/tune/scheduler.py): the rungs' budgets, ASHA's promotions, Hyperband's
brackets and the final promotion, read from trials given as data; and a whole study driven through it with a fake
objective, whose counts of trials at each rung are successive halving's."""

from __future__ import annotations

import heapq
from typing import Callable, Dict, List, Optional

import pytest

from hpc_train.tune.scheduler import (
    COMPLETED,
    FAILED,
    NEW,
    PAUSED,
    PROMOTE,
    RUNNING,
    STOPPED,
    Action,
    Scheduler,
    TrialView,
    budgets,
)
from hpc_train.tune.settings import SchedulerSettings

DIRECTIONS = ("minimize", "maximize")


def _settings(name="asha", min_resource=1, max_resource=9, eta=3) -> SchedulerSettings:
    return SchedulerSettings(name, "trainer.max_steps", min_resource, max_resource, eta)


def _scheduler(direction="minimize", **settings) -> Scheduler:
    return Scheduler(_settings(**settings), direction)


def _view(number, rung, status, values, direction="minimize", bracket=0) -> TrialView:
    """A trial as the controller shows it; written for minimize, its values negated for maximize (same ranking)."""
    sign = 1.0 if direction == "minimize" else -1.0
    return TrialView(number, bracket, rung, status, {r: sign * v for r, v in values.items()})


# -- the rungs' budgets -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "min_resource, max_resource, eta, expected",
    [
        (1, 81, 3, [1, 3, 9, 27, 81]),
        (2, 20, 3, [2, 6, 20]),  # 20 // 9, 20 // 3, 20: the last rung is max_resource, the rest divide it
        (5, 5, 3, [5]),
        (1, 8, 2, [1, 2, 4, 8]),
        (3, 10, 3, [3, 10]),  # 3 * 9 > 10: one step of eta fits
        (4, 10, 3, [10]),  # 4 * 3 > 10: no step fits, one rung at max_resource
    ],
)
def test_the_rungs_budgets(min_resource, max_resource, eta, expected):
    assert budgets(_settings("asha", min_resource, max_resource, eta)) == expected
    assert budgets(_settings("hyperband", min_resource, max_resource, eta)) == expected


def test_without_a_scheduler_one_rung_at_max_resource():
    assert budgets(_settings("none", 1, 81, 3)) == [81]
    assert budgets(SchedulerSettings("none", None, 1, None, 3)) == [None]  # the trial's own length


# -- ASHA's promotions --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_asha_promotes_a_paused_trial_in_the_best_third_of_its_rung(direction):
    values = [0.7, 0.2, 0.9, 0.4, 0.8, 0.6]  # trial i's value at rung 0; the best two (6 // 3): trials 1 and 3
    trials = [_view(i, 0, PAUSED, {0: v}, direction) for i, v in enumerate(values)]
    sched = _scheduler(direction)
    assert [t.number for t in sched.promotable(trials, bracket=0, rung=0)] == [1, 3]
    assert sched.next_action(trials, started=6, max_trials=10) == Action(PROMOTE, rung=1, bracket=0, trial=1)
    # trial 1 promoted (now running rung 1): trial 3 is next, still in the best two of six
    trials[1] = _view(1, 1, RUNNING, {0: 0.2}, direction)
    assert sched.next_action(trials, started=6, max_trials=10) == Action(PROMOTE, rung=1, bracket=0, trial=3)
    # both promoted: nothing else is in the best two, so a new trial starts at rung 0
    trials[3] = _view(3, 1, RUNNING, {0: 0.4}, direction)
    assert sched.next_action(trials, started=6, max_trials=10) == Action(NEW, rung=0, bracket=0)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_fewer_than_eta_trials_at_a_rung_promote_none(direction):
    trials = [_view(0, 0, PAUSED, {0: 0.1}, direction), _view(1, 0, PAUSED, {0: 0.5}, direction)]
    assert _scheduler(direction).promotable(trials, 0, 0) == []
    assert _scheduler(direction).next_action(trials, 2, 10) == Action(NEW, rung=0, bracket=0)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_the_highest_rung_is_promoted_first(direction):
    trials = [
        *(_view(i, 0, PAUSED, {0: v}, direction) for i, v in enumerate([0.1, 0.5, 0.6, 0.7, 0.8, 0.9])),
        *(_view(i, 1, PAUSED, {0: i / 10 - 0.4, 1: i / 10 - 0.5}, direction) for i in (6, 7, 8)),
    ]
    # rung 0's best three of nine: trials 0 (paused there), 6 and 7; rung 1's best one of three: trial 6
    sched = _scheduler(direction)
    assert [t.number for t in sched.promotable(trials, 0, 0)] == [0]
    assert [t.number for t in sched.promotable(trials, 0, 1)] == [6]
    assert sched.next_action(trials, 9, 10) == Action(PROMOTE, rung=2, bracket=0, trial=6)
    trials[6] = _view(6, 2, RUNNING, {0: 0.2, 1: 0.1}, direction)
    assert sched.next_action(trials, 9, 10) == Action(PROMOTE, rung=1, bracket=0, trial=0)


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_failed_or_running_trial_is_never_promoted(direction):
    sched = _scheduler(direction)
    # the best at rung 0 runs rung 1 (already promoted): it ranks, but the best third (one of three) is it alone
    running = [_view(0, 1, RUNNING, {0: 0.1}, direction), *(_view(i, 0, PAUSED, {0: i}, direction) for i in (1, 2))]
    assert sched.promotable(running, 0, 0) == []
    # a failed trial ranks nowhere: of the three others, the best third is trial 1
    failed = [_view(0, 1, FAILED, {0: 0.1}, direction), *(_view(i, 0, PAUSED, {0: i}, direction) for i in (1, 2, 3))]
    assert [t.number for t in sched.promotable(failed, 0, 0)] == [1]
    # a trial running its first rung has no value yet and ranks nowhere
    fresh = [_view(i, 0, PAUSED, {0: i}, direction) for i in (1, 2)] + [_view(3, 0, RUNNING, {}, direction)]
    assert sched.promotable(fresh, 0, 0) == []
    # a stopped trial (the study ended) ranks but is not promoted
    stopped = [_view(0, 0, STOPPED, {0: 0.1}, direction), *(_view(i, 0, PAUSED, {0: i}, direction) for i in (1, 2))]
    assert sched.promotable(stopped, 0, 0) == []


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_ties_go_to_the_lower_trial_number(direction):
    trials = [_view(i, 0, PAUSED, {0: v}, direction) for i, v in [(5, 0.3), (2, 0.3), (7, 0.3)]]
    assert [t.number for t in _scheduler(direction).promotable(trials, 0, 0)] == [2]


def test_maximize_promotes_the_highest_value():
    trials = [_view(i, 0, PAUSED, {0: v}) for i, v in enumerate([0.1, 0.9, 0.5])]  # plain values, no negation
    assert [t.number for t in _scheduler("minimize").promotable(trials, 0, 0)] == [0]
    assert [t.number for t in _scheduler("maximize").promotable(trials, 0, 0)] == [1]


# -- new trials, waiting, the final promotion ---------------------------------------------------------------------


def test_a_new_trial_while_trials_are_left_then_none_while_trials_run():
    sched = _scheduler()
    assert sched.next_action([], started=0, max_trials=2) == Action(NEW, rung=0, bracket=0)
    running = [_view(0, 0, RUNNING, {}), _view(1, 0, RUNNING, {})]
    assert sched.next_action(running, started=2, max_trials=2) is None
    one_paused = [_view(0, 0, PAUSED, {0: 0.1}), _view(1, 0, RUNNING, {})]
    assert sched.next_action(one_paused, started=2, max_trials=2) is None  # waits: trial 1 may rank above it


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_the_final_promotion_takes_the_best_paused_trial_of_the_highest_rung(direction):
    trials = [
        _view(0, 1, PAUSED, {0: 0.2, 1: 0.5}, direction),
        _view(1, 1, PAUSED, {0: 0.3, 1: 0.3}, direction),  # the best at rung 1
        _view(2, 0, PAUSED, {0: 0.9}, direction),
        _view(3, 0, PAUSED, {0: 0.8}, direction),
        _view(4, 0, PAUSED, {0: 0.95}, direction),
        _view(5, 0, FAILED, {}, direction),
    ]
    # rung 0's best one of five (5 // 3) is trial 0, past it; rung 1 has two trials, fewer than eta: no promotion
    sched = _scheduler(direction)
    assert sched.next_action(trials, started=6, max_trials=7) == Action(NEW, rung=0, bracket=0)
    assert sched.next_action(trials, started=6, max_trials=6) == Action(PROMOTE, rung=2, bracket=0, trial=1)
    # a tie at the highest rung goes to the lower number
    trials[0] = _view(0, 1, PAUSED, {0: 0.2, 1: 0.3}, direction)
    assert sched.next_action(trials, started=6, max_trials=6) == Action(PROMOTE, rung=2, bracket=0, trial=0)


def test_no_final_promotion_once_a_trial_completed_or_while_one_runs():
    trials = [_view(0, 1, PAUSED, {0: 0.2, 1: 0.5}), _view(1, 0, PAUSED, {0: 0.3}), _view(2, 0, PAUSED, {0: 0.4})]
    sched = _scheduler(max_resource=9)  # rungs 1, 3, 9
    assert sched.next_action(trials, 3, 3) == Action(PROMOTE, rung=2, bracket=0, trial=0)
    done = [*trials, _view(3, 2, COMPLETED, {0: 0.9, 1: 0.9, 2: 0.9})]
    assert sched.next_action(done, 4, 4) is None
    busy = [*trials, _view(3, 0, RUNNING, {})]
    assert sched.next_action(busy, 4, 4) is None
    assert sched.next_action([_view(0, 0, FAILED, {})], 1, 1) is None  # nothing paused: the study is over


def test_without_a_scheduler_every_trial_runs_its_one_rung():
    sched = _scheduler("minimize", name="none", max_resource=81)
    assert sched.brackets == 1 and sched.is_last(0)
    trials = [_view(i, 0, COMPLETED, {0: i}) for i in range(3)]
    assert sched.next_action(trials, 3, 5) == Action(NEW, rung=0, bracket=0)
    assert sched.next_action(trials, 3, 3) is None


# -- Hyperband's brackets -----------------------------------------------------------------------------------------


def test_hyperband_has_one_bracket_per_rung_and_starts_trial_n_in_bracket_n_mod_brackets():
    assert _scheduler(name="hyperband", max_resource=81).brackets == 5
    assert _scheduler(name="asha", max_resource=81).brackets == 1
    sched = _scheduler(name="hyperband", max_resource=9)  # rungs 1, 3, 9: brackets 0, 1, 2
    assert sched.brackets == 3
    starts = [sched.next_action([], started=n, max_trials=10) for n in range(7)]
    assert [(a.kind, a.bracket, a.rung) for a in starts] == [(NEW, n % 3, n % 3) for n in range(7)]
    assert [sched.bracket_of(n) for n in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_hyperband_promotes_within_a_bracket_only():
    sched = _scheduler(name="hyperband", max_resource=9)
    trials = [
        _view(0, 1, PAUSED, {0: 0.5, 1: 0.1}, bracket=0),  # the best at rung 1, alone there in bracket 0
        _view(3, 0, PAUSED, {0: 0.6}, bracket=0),
        _view(1, 1, PAUSED, {1: 0.5}, bracket=1),
        _view(4, 1, PAUSED, {1: 0.6}, bracket=1),
    ]
    # pooled, rung 1 would hold three trials and promote trial 0; per bracket it holds one and two: none
    assert sched.next_action(trials, started=5, max_trials=9) == Action(NEW, rung=2, bracket=2)
    trials.append(_view(7, 1, PAUSED, {1: 0.4}, bracket=1))  # bracket 1 has three at rung 1: its best goes on
    assert sched.next_action(trials, started=8, max_trials=9) == Action(PROMOTE, rung=2, bracket=1, trial=7)


# -- a whole study, simulated -------------------------------------------------------------------------------------


def _simulate(objective: Callable[[int], float], direction: str, slots: int, trials: int = 27) -> List[List[int]]:
    """Drive a Scheduler over `trials` trials with rungs 1, 3, 9, 27 (eta 3) and `slots` slots: each run takes its
    rung's budget in time, the earliest end (then the earliest start) finishes first, and a trial's value is
    `objective(number)` at every rung. Returns the trials that finished each rung."""
    sched = _scheduler(direction, max_resource=27)
    sign = 1.0 if direction == "minimize" else -1.0
    state: Dict[int, TrialView] = {}
    running: List[tuple] = []  # (end time, start order, trial)
    clock = order = 0
    while True:
        while len(running) < slots:
            action: Optional[Action] = sched.next_action(list(state.values()), len(state), trials)
            if action is None:
                break
            number = len(state) if action.kind == NEW else action.trial
            values = state[number].values if number in state else {}
            state[number] = TrialView(number, action.bracket, action.rung, RUNNING, values)
            order += 1
            heapq.heappush(running, (clock + sched.budgets[action.rung], order, number))
        if not running:
            break
        clock, _, number = heapq.heappop(running)
        t = state[number]
        status = COMPLETED if sched.is_last(t.rung) else PAUSED
        state[number] = TrialView(number, t.bracket, t.rung, status, {**t.values, t.rung: sign * objective(number)})
    assert all(t.status in (PAUSED, COMPLETED) for t in state.values()) and len(state) == trials
    return [sorted(n for n, t in state.items() if rung in t.values) for rung in range(len(sched.budgets))]


@pytest.mark.parametrize("slots", [1, 3, 4])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_simulated_study_halves_as_successive_halving_does(direction, slots):
    # Objective: (7 n + 5) mod 27, a permutation of 0..26 (7 is prime to 27) that spreads the good trials out. The
    # best nine (values 0..8) are trials 7, 11, 15, 19, 23, 0, 4, 8, 12 (n = 4 (v - 5) mod 27, 4 = 1/7 mod 27).
    # Synchronous successive halving keeps 9 of 27, then 3 of 9 (values 0, 1, 2: trials 7, 11, 15), then 1 (7).
    # ASHA matches it here because it never promotes a trial outside that set:
    # * rung 0: trials finish it in number order (same budget, started in order). The k-th of them to finish is
    #   promoted only while it is in the best floor(n/3) of the n finished; the best nine are trials 0, 4, 7, 8, 11,
    #   12, 15, 19, 23, so the first n hold at least floor(n/3) of them for every n (n=3: 1, 6: 2, 9: 4, 12: 5,
    #   15: 7, 18: 7, 21: 8, 24: 9), and only those nine are ever promoted; at n = 27 all nine are in the best nine.
    # * rung 1: the nine reach it in the order they enter the best third at rung 0: 0 (n=3), 4 (n=6), 7 (n=8),
    #   11 (n=12), 8 (n=15), 15 (n=16), 19, 23, 12, with values 5, 6, 0, 1, 7, 2, 3, 4, 8: each prefix's best
    #   third lies in {0, 1, 2}, so only trials 7, 11 and 15 go on; at rung 2 the best of those three, 7.
    rungs = _simulate(lambda n: (7 * n + 5) % 27, direction, slots)
    assert [len(r) for r in rungs] == [27, 9, 3, 1]
    assert rungs[1] == [0, 4, 7, 8, 11, 12, 15, 19, 23]
    assert rungs[2] == [7, 11, 15]
    assert rungs[3] == [7]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_simulated_study_whose_first_trials_are_best(direction):
    # value = n: every prefix's best third is its first trials, so ASHA keeps 0..8, then 0, 1, 2, then 0
    rungs = _simulate(lambda n: n, direction, slots=3)
    assert rungs == [list(range(27)), list(range(9)), [0, 1, 2], [0]]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_a_simulated_study_whose_last_trials_are_best_promotes_more(direction):
    # value = -n: each trial finishing a rung is the best of those before it, so once three finished a rung every
    # later one is promoted (ASHA's asynchrony: it cannot wait for the rest). Trials 0 and 1 stop at rung 0, 2 and
    # 3 at rung 1, 4 and 5 at rung 2: 25, 23 and 21 trials reach rungs 1, 2 and 3. The best (26) still completes.
    rungs = _simulate(lambda n: -n, direction, slots=3)
    assert [len(r) for r in rungs] == [27, 25, 23, 21]
    assert rungs[3] == list(range(6, 27))


# -- the stopping form: trials that cannot pause ------------------------------------------------------------------


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_the_stopping_form_lets_a_trial_go_on_while_it_is_in_the_best_third_of_those_at_its_rung(direction):
    """Trial 9 has reached rung 0 (running): it goes on while it ranks among the best max(1, floor(n / 3)) of the n
    trials of its bracket with a value there, itself included; failed trials rank nowhere."""
    scheduler = _scheduler(direction)

    def goes_on(mine, others, bracket=0, failed=()):
        views = [_view(9, 0, RUNNING, {0: mine}, direction)]
        for number, value in enumerate(others):
            status = FAILED if number in failed else STOPPED
            views.append(_view(number, 0, status, {0: value}, direction, bracket=bracket))
        return scheduler.goes_on(views, 9, 0)

    assert goes_on(5.0, [])  # the first at a rung always goes on
    assert goes_on(5.0, [6.0]) and not goes_on(5.0, [4.0])  # n = 2: the best one
    assert goes_on(2.0, [1.0, 3.0, 4.0, 5.0, 6.0]) and not goes_on(3.0, [1.0, 2.0, 4.0, 5.0, 6.0])  # n = 6: best 2
    assert goes_on(5.0, [4.0], bracket=1)  # another bracket's trials do not compete
    assert goes_on(5.0, [4.0], failed=(0,))  # nor do failed ones
    assert not goes_on(5.0, [5.0])  # a tie: the older trial ranks first, and it is the only one kept


def test_the_stopping_form_reads_the_rungs_a_running_trial_s_reports_have_reached():
    """A rung is reached at the first report at a step at or past its budget; the rungs after the first unreached one
    are not; reading starts at the trial's current rung."""
    from hpc_train.tune.scheduler import rungs_reached

    reports = [(1, 5.0, 10.0), (2, 4.0, 11.0), (4, 3.0, 12.0), (5, 2.5, 13.0)]
    assert rungs_reached(reports, [1, 3, 9], 0) == [(0, 5.0, 10.0), (1, 3.0, 12.0)]  # rung 1's: step 4, not step 2
    assert rungs_reached(reports, [1, 3, 9], 1) == [(1, 3.0, 12.0)]
    assert rungs_reached(reports + [(9, 1.0, 14.0)], [1, 3, 9], 2) == [(2, 1.0, 14.0)]
    assert rungs_reached([], [1, 3, 9], 0) == []
    assert rungs_reached([(2, 4.0, 11.0)], [3, 9], 0) == []  # a report before the budget reaches nothing
    assert rungs_reached(reports, [None], 0) == []  # the trial's own length (no resource key): only its end says
