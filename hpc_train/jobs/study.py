"""An adaptive sweep's study on disk: an Optuna journal in the sweep dir, and what each trial's attributes mean.

The journal (``<sweep dir>/study.journal``) is Optuna's JournalStorage over a file, locked by open(O_EXCL) so that it
holds on a shared (NFS) filesystem. It is the controller's whole state: a controller started again on the same sweep
dir reads it and goes on; ``hpc-train-report`` and ``optuna-dashboard`` read it as well. Each trial is an Optuna
trial: its parameters, its rungs' objective values as intermediate values (step = the rung's budget), and the
user attributes named below. A trial paused at a rung (it may yet be promoted) is RUNNING to Optuna; at the end of the
study it is PRUNED. Optuna is imported only where a study is opened (it is the `tune` extra).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpc_train.records import run_claim

JOURNAL = "study.journal"
STUDY_NAME = "hpc-train"
# A trial's user attributes
STATUS = "status"  # running | paused | completed | failed | stopped (hpc_train.tune.scheduler.STATUSES)
RUNG = "rung"  # the rung it runs, or the last it finished (0 = the first)
BRACKET = "bracket"
JOB = "job_id"  # the job of its current (or last) rung
LAUNCHER = "launcher"
RUN_DIR = "run_dir"
ERROR = "error"  # why it failed
RUNG_VALUES = "rung_values"  # {rung: objective}: what the scheduler ranks (also the intermediate values, by budget)
RUNG_SECONDS = "rung_seconds"  # {rung: seconds the rung's job ran}: what the study spent
RUNG_TIMES = "rung_times"  # {rung: [started, seen to end or None]}: when the controller started it and saw it end
# The study's
SETTINGS = "settings"  # the sweeper's settings and search space when it started: a rerun must ask for the same
INFO = "info"  # what the report reads, as plain data: direction, objective, resource_key, budgets (one per rung),
# max_trials, max_concurrent (objective None: the config's, which each trial's job_config.yaml holds)


def journal_path(sweep_dir: Path) -> Path:
    return Path(sweep_dir) / JOURNAL


def storage(sweep_dir: Path) -> Any:
    """The study's storage: Optuna's journal over the sweep dir's file."""
    # the tune extra: only adaptive sweeps open a study
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    path = str(journal_path(sweep_dir))
    return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))


def controller_state(sweep_dir: Path) -> Tuple[Optional[bool], str]:
    """(whether the study's controller is alive: True, gone: False, no controller holds the study: None; the line
    that says so). The controller claims the sweep dir while it runs (hpc_train.tune.placement) and refreshes the
    claim every run_claim.REFRESH_S: a claim whose holder is gone is a controller that was killed."""
    claim = run_claim.read(Path(sweep_dir))
    if claim is None:
        return None, "controller: none (it ended, or was never started on this sweep dir)"
    live, why = run_claim.liveness(claim)
    how = f", {claim.how}" if claim.how else ""
    if live:
        return True, f"controller: running, {claim.describe()}{how}"
    seen = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(claim.refreshed))
    again = f"`{claim.command}`" if claim.command else "the command that started it"
    return False, (
        f"controller: gone, last seen alive at {seen} ({claim.describe()}{how}: {why}); nothing runs the study:"
        f" run {again} again to go on with it"
    )


def trial_rows(sweep_dir: Path) -> Optional[List[Dict[str, Any]]]:
    """Each trial as a plain row (number, state, status, params, rung values, value, error...), or None when the sweep
    dir holds no study."""
    found = read_study(sweep_dir)
    return None if found is None else found[1]


def read_study(sweep_dir: Path) -> Optional[Tuple[Dict[str, Any], List[Dict[str, Any]]]]:
    """(the study's INFO, with its direction always, each trial as trial_rows gives it), or None when the sweep dir
    holds no study; the journal is read once."""
    if not journal_path(sweep_dir).exists():
        return None
    import optuna  # the tune extra (see storage)

    study = optuna.load_study(study_name=STUDY_NAME, storage=storage(sweep_dir))
    info = {"direction": study.direction.name.lower(), **(study.user_attrs.get(INFO) or {})}
    return info, [_row(trial) for trial in study.get_trials(deepcopy=False)]


def _row(trial: Any) -> Dict[str, Any]:
    attrs = trial.user_attrs
    return {
        "number": trial.number,
        "state": trial.state.name,
        "status": attrs.get(STATUS),
        "params": dict(trial.params),
        "rung": attrs.get(RUNG),
        "bracket": attrs.get(BRACKET),
        "rung_values": {int(k): v for k, v in (attrs.get(RUNG_VALUES) or {}).items()},
        "rung_seconds": {int(k): v for k, v in (attrs.get(RUNG_SECONDS) or {}).items()},
        "rung_times": {int(k): v for k, v in (attrs.get(RUNG_TIMES) or {}).items()},
        "intermediate": dict(trial.intermediate_values),
        "value": trial.value if trial.state.name == "COMPLETE" else None,
        "run_dir": attrs.get(RUN_DIR),
        "job_id": attrs.get(JOB),
        "error": attrs.get(ERROR),
    }
