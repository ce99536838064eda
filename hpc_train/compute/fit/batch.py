"""Several job specs estimated in one call, as the login side asks (a job, or the settings its refusal suggests).

A spec with a budget (the most bytes of tensors its GPU can hold, the device's share taken off) is first given its
floor (:mod:`hpc_train.compute.fit.floor`, each model's once, in this process): one whose floor is over its budget
is answered with it, unsimulated. The others are estimated rank by rank, each rank a task of its own, so that a
pipeline's stages spread over the worker processes, in the order of the specs. With ``enough``, once the first that
many specs (in their order) that fit their budgets are known, the specs after them are answered skipped (whether or
not their tasks had finished: the answer does not depend on which task finished first) and their tasks stopped.

Each answer is ``(data, words)``: the estimate (``JobEstimate.as_dict``, the floor's with ``floor`` set), or
``{"refused": "<what, and the fix>"}`` for a job the estimate cannot simulate, or ``{"skipped": "<why>"}``.
"""

from __future__ import annotations

import collections
import multiprocessing
import queue
import time
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Set, Tuple

from omegaconf import DictConfig, OmegaConf

from hpc_train.compute.fit.breakdown import JobEstimate, RankEstimate
from hpc_train.compute.fit.estimate import EstimateSettings, check_simulated, estimate_rank, representative_ranks
from hpc_train.compute.fit.floor import floor_of
from hpc_train.compute.runtime.refusal import Refusal
from hpc_train.compute.settings import JobSettings, section
from hpc_train.compute.user.instantiate import add_code_dirs

Answer = Tuple[Dict[str, Any], str]  # (the JSON object, the words) for one spec
SKIPPED = "not estimated: enough of the settings before it fit"


@dataclass(frozen=True)
class Request:
    """What one call estimates: the specs' paths, in order, and how."""

    paths: Sequence[str]
    ranks: Optional[List[int]] = None  # None: each spec's representative ranks (one per pipeline stage)
    workers: int = 1
    costs: bool = False
    device: str = "gpu"
    budgets: Optional[Sequence[int]] = None  # one per spec: its floor is checked against it first
    enough: Optional[int] = None  # stop once this many specs fit their budgets


def answers(request: Request, forks_again: bool = False) -> List[Answer]:
    """Each spec's answer, in the order of `request.paths`: the floors in this process (each model's once), then
    the ranks' tasks, in worker processes forked after the floors (which they inherit with the specs read), or here
    where one process does. `forks_again` (a process serving several requests): the tasks always run in workers,
    since a process that has run autograd's backward cannot fork safely."""
    batch = _Batch(request)
    tasks = batch.floors()
    if tasks == 0 or (not forks_again and (request.workers <= 1 or tasks == 1)):
        return batch.run(_Inline())
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")  # torch imported, nothing run
    with context.Pool(min(max(1, request.workers), tasks)) as pool:
        try:
            return batch.run(_Pooled(pool))
        finally:
            pool.terminate()  # the tasks of specs skipped, still running


def load(path: str, device: str) -> EstimateSettings:
    """The job spec at `path` as the estimate reads it, the user's code importable as on the ranks."""
    spec = OmegaConf.load(path)
    assert isinstance(spec, DictConfig)
    add_code_dirs(section(JobSettings, spec.job).code_dirs)
    return EstimateSettings.from_job_spec(spec, device)


_loaded: Dict[Tuple[str, str], EstimateSettings] = {}  # this process's specs, by (path, device)


def _settings(path: str, device: str) -> EstimateSettings:
    if (path, device) not in _loaded:
        _loaded[(path, device)] = load(path, device)
    return _loaded[(path, device)]


def rank_task(path: str, device: str, rank: int, costs: bool) -> Tuple[str, Any]:
    """("rank", (the rank's estimate data, seconds)) or ("refused", its words)."""
    started = time.perf_counter()
    try:
        settings = _settings(path, device)
        check_simulated(settings)
        estimate = estimate_rank(settings, rank, costs)
    except Refusal as refusal:
        return "refused", str(refusal)
    return "rank", (estimate.as_dict(), time.perf_counter() - started)


class _Inline:
    """Tasks run in this process, one at a time, when the batch asks for the next result (none run ahead)."""

    def __init__(self) -> None:
        self.waiting: Deque[Tuple[Callable[..., Any], tuple, Callable[[Any], None]]] = collections.deque()

    def submit(self, task: Callable[..., Any], args: tuple, done: Callable[[Any], None]) -> None:
        self.waiting.append((task, args, done))

    def next(self) -> None:
        task, args, done = self.waiting.popleft()
        done(task(*args))


class _Pooled:
    """Tasks run in a pool's worker processes; their results come back in the order they finish."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.finished: "queue.Queue[Tuple[bool, Any, Callable[[Any], None]]]" = queue.Queue()

    def submit(self, task: Callable[..., Any], args: tuple, done: Callable[[Any], None]) -> None:
        self.pool.apply_async(
            task,
            args,
            callback=lambda result: self.finished.put((True, result, done)),
            error_callback=lambda error: self.finished.put((False, error, done)),
        )

    def next(self) -> None:
        ok, result, done = self.finished.get()
        if not ok:
            raise result  # a crash in the user's code: the process ends with its traceback
        done(result)


class _Batch:
    """The specs' answers: floors first where budgeted, then each rank's estimate as its task finishes."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.answers: Dict[int, Answer] = {}
        self.ranks: Dict[int, Dict[int, RankEstimate]] = {}
        self.wanted: Dict[int, List[int]] = {}
        self.seconds: Dict[int, float] = {}
        self.fitting: Set[int] = set()  # the specs known to fit their budgets

    def floors(self) -> int:
        """Answer each spec whose floor is over its budget (or that is refused); the number of rank tasks left."""
        for index, path in enumerate(self.request.paths):
            settings = _settings(path, self.request.device)
            budget = self._budget(index)
            try:
                check_simulated(settings)
                floor = floor_of(settings) if budget is not None else None
            except Refusal as refusal:
                self._refuse(index, str(refusal))
                continue
            if floor is not None and floor.peak > budget:  # type: ignore[operator]
                self.answers[index] = (floor.as_dict(), floor.describe())
                continue
            ranks = self.request.ranks
            self.wanted[index] = list(ranks if ranks is not None else representative_ranks(settings.layout))
            self.ranks[index] = {}
        return sum(len(ranks) for ranks in self.wanted.values())

    def run(self, runner: Any) -> List[Answer]:
        """The rank tasks, in the specs' order, until every spec is answered or `enough` fit."""
        for index, ranks in self.wanted.items():
            path, request = self.request.paths[index], self.request
            for rank in ranks:
                runner.submit(rank_task, (path, request.device, rank, request.costs), self._on_rank(index, rank))
        last = self._enough()
        while len(self.answers) < len(self.request.paths) and last is None:
            runner.next()
            last = self._enough()
        skipped = ({"skipped": SKIPPED}, f"skipped: {SKIPPED}")
        kept = range(len(self.request.paths) if last is None else last + 1)
        return [self.answers[index] if index in kept else skipped for index in range(len(self.request.paths))]

    def _budget(self, index: int) -> Optional[int]:
        return None if self.request.budgets is None else int(self.request.budgets[index])

    def _enough(self) -> Optional[int]:
        """The index of the spec that makes `enough` fit, counting in order, once every spec before it is answered
        (the same specs whichever tasks finish first); None until then."""
        if self.request.enough is None:
            return None
        fitting = 0
        for index in range(len(self.request.paths)):
            if index not in self.answers:
                return None
            fitting += index in self.fitting
            if fitting == self.request.enough:
                return index
        return None

    def _on_rank(self, index: int, rank: int) -> Callable[[Tuple[str, Any]], None]:
        def done(result: Tuple[str, Any]) -> None:
            kind, data = result
            if index in self.answers:  # refused by another of its ranks
                return
            if kind == "refused":
                self._refuse(index, data)
                return
            estimate, seconds = data
            self.ranks[index][rank] = RankEstimate(**estimate)
            self.seconds[index] = self.seconds.get(index, 0.0) + seconds
            if len(self.ranks[index]) == len(self.wanted[index]):
                self._finish(index)

        return done

    def _finish(self, index: int) -> None:
        settings = _settings(self.request.paths[index], self.request.device)
        ranks = [self.ranks[index][rank] for rank in self.wanted[index]]
        estimate = JobEstimate(settings.layout.describe(on_cpus=True), ranks, self.seconds[index])
        self.answers[index] = (estimate.as_dict(), estimate.describe())
        budget = self._budget(index)
        if budget is not None and estimate.peak <= budget:
            self.fitting.add(index)

    def _refuse(self, index: int, words: str) -> None:
        self.answers[index] = ({"refused": words}, f"refused: {words}")
