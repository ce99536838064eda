"""A sweep dir another sweep's runs hold: refused before anything of this sweep is queued or written.

Hydra numbers a sweep's jobs from 0, and job N's run dir is ``<sweep dir>/N``. A second sweep into a sweep dir
(``hydra.sweep.dir`` fixed in a config, say) would give its jobs the first sweep's run dirs. So, at a sweep's first
batch (hpc-train's own, a Hydra app's, packed or not; on the cluster for a sweep forwarded from a laptop):

* a sweep dir whose job table lists live jobs (queued or running: Slurm jobs, packed runs, a Hydra app's local jobs)
  is refused, naming them and the fixes: another ``hydra.sweep.dir``, wait, or cancel them (``scancel``);
* in a sweep dir whose jobs have all ended, a job whose number an earlier run of other overrides holds is refused
  (its run dir holds that run's records); a job with the same overrides is the same run again (a finished run is
  kept, an unfinished one resumes), so re-running a sweep's command into its own sweep dir goes on.

Nothing of the sweep dir changes by a refusal: its status is the live sweep's, and Hydra's ``multirun.yaml``, which
the sweeper writes before the launcher runs, is put back as it was (:class:`Found`, taken at the launcher's
``setup``, before the sweeper writes); a dry run leaves the sweep dir as it found it, or none. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from hpc_train.config.errors import ConfigError
from hpc_train.jobs import job_states, job_table, submissions
from hpc_train.jobs.sweep_status import MULTIRUN, STATUS, alive, live_launcher
from hpc_train.launch.hydra.cli_child import overrides_of, path_value
from hpc_train.pack import records, status
from hpc_train.records import as_found, rundir

KEY = "hydra.sweep.dir"
SHOWN = 5  # live jobs named in the message (the count says the rest)
LOCAL = "RUNNING (a local process)"  # a Hydra app's local job whose process lives
SWEEP_RECORDS = (MULTIRUN, STATUS)  # what a sweep writes into the sweep dir itself (Hydra's, hpc_train's)


@dataclass
class Found:
    """The sweep dir as this command found it, taken before Hydra's sweeper writes into it (the launcher's ``setup``),
    to be put back after a refusal or a dry run: its records as they were (a live sweep's), or no sweep dir. Only what
    this command wrote goes: another command's files in the same sweep dir stay."""

    path: Path
    top: Optional[Path]  # the highest folder this command will make for it; None: the sweep dir was there
    records: as_found.FilesAsFound  # each of SWEEP_RECORDS' bytes as they were (None: absent)
    made: List[Path] = field(default_factory=list)  # job dirs this command made in it (a local dry run's jobs)

    @classmethod
    def take(cls, sweep_dir: Path) -> "Found":
        records = as_found.FilesAsFound.take((sweep_dir / name for name in SWEEP_RECORDS), times=False)
        return cls(sweep_dir, as_found.highest_missing(sweep_dir), records)

    def note_job_dir(self, job_dir: Path) -> None:
        """A job's dir, before the job runs: this command's to remove when it is new."""
        if not job_dir.exists():
            self.made.append(job_dir)

    def put_back(self) -> None:
        """The sweep dir as found: the job dirs this command made removed, the records rewritten as they were (or
        removed when they were not there), and the folders made for them removed when that leaves them empty."""
        for job_dir in self.made:
            as_found.remove_made(job_dir, job_dir)
        self.records.put_back()
        if self.records.files[self.path / STATUS] is None:
            as_found.remove_empty(self.path / STATUS.parent)
        if self.top is not None:
            as_found.remove_empty(self.path, self.top)


def found_for(config: DictConfig) -> Found:
    """The sweep dir of this command as found, taken at the launcher's ``setup``. One named by the clock (``${now:``,
    the default ``multirun/<date>/<time>``) is made now for this command alone, ``<time>-1``, ``-2``, ... when another
    command took that second (an atomic mkdir, as for run dirs), written into the config and into Hydra's overrides,
    from which every job's config is composed again."""
    sweep_dir = Path(str(config.hydra.sweep.dir))
    found = Found.take(sweep_dir)
    if "${now:" not in str(OmegaConf.to_container(config.hydra.sweep, resolve=False).get("dir")):
        return found  # a sweep dir the user named is shared on purpose: check() guards it
    made = as_found.fresh_dir(sweep_dir)
    if made == sweep_dir:
        return found
    with read_write(config.hydra), open_dict(config.hydra):
        config.hydra.sweep.dir = str(made)
        config.hydra.overrides.hydra.append(f"{KEY}={path_value(made)}")
    return Found(made, made, as_found.FilesAsFound({made / name: None for name in SWEEP_RECORDS}, times=False))


def check(sweep_dir: Path, jobs: Sequence[Tuple[int, Sequence[str]]]) -> None:
    """Refuse (ConfigError naming hydra.sweep.dir) a sweep of `jobs` ((number, its overrides without Hydra's own))
    into `sweep_dir` when its job table lists live jobs, or a sweep's launcher still runs there on this host (a local
    sweep keeps no job table), or a run of other overrides holds one of the numbers (as the job table lists it, else as
    the run's own record of its overrides says)."""
    rows = job_table.newest(sweep_dir)
    live = _live(sweep_dir, rows) if rows else []
    if live:
        raise _taken_by_live(sweep_dir, live)
    launcher = live_launcher(sweep_dir)
    if launcher is not None:
        raise _taken_by_launcher(sweep_dir, launcher)
    for number, words in jobs:
        overrides, earlier = " ".join(words), rows.get(str(number))
        if earlier is not None and earlier.overrides != overrides:
            raise _taken_by_ended(sweep_dir, number, overrides, earlier)
        # a local sweep's run: its overrides as Hydra recorded them; one written before each job recorded its swept
        # values names only those its sweep's jobs shared (a subset of the same sweep's)
        recorded = overrides_of(sweep_dir / str(number), []) if earlier is None else []
        if not set(recorded) <= set(words):
            raise _taken_by_local_run(sweep_dir, number, overrides, " ".join(recorded))


def _live(sweep_dir: Path, rows: Dict[str, job_table.JobRow]) -> List[Tuple[job_table.JobRow, str]]:
    """(row, its state) of every job of the table that has not ended, in job order."""
    packed = [row for row in rows.values() if records.is_packed_id(row.job_id)]
    local = {job_id for job_id, entry in submissions.submissions(sweep_dir).items() if entry.get("local")}
    slurm = [row for row in rows.values() if row not in packed and row.job_id not in local]
    states: Dict[str, Optional[str]] = {}
    if packed:
        runs = status.packed_states(sweep_dir)
        states.update({row.job_id: getattr(runs.get(row.job), "state", None) for row in packed})
    if slurm:
        states.update(job_states.slurm_states([row.job_id for row in slurm]))
    states.update({row.job_id: LOCAL for row in rows.values() if row.job_id in local and alive(row.job_id)})
    ended = {*job_states.ENDED, *records.ENDED_STATES, None}
    return [(row, str(states.get(row.job_id))) for row in rows.values() if states.get(row.job_id) not in ended]


def _taken_by_live(sweep_dir: Path, live: List[Tuple[job_table.JobRow, str]]) -> ConfigError:
    named = ", ".join(f"job #{row.job} as {row.job_id} ({state})" for row, state in live)
    if len(live) > SHOWN:
        named = ", ".join(named.split(", ")[:SHOWN]) + f" and {len(live) - SHOWN} more"
    ids = sorted({records.split_packed_id(row.job_id)[0] for row, state in live if state != LOCAL})
    pids = sorted(row.job_id for row, state in live if state == LOCAL)
    cancel = " and ".join(
        ([f"scancel {' '.join(ids)}"] if ids else []) + ([f"kill {' '.join(pids)} (local jobs)"] if pids else [])
    )
    return ConfigError(
        KEY,
        f"the sweep dir {sweep_dir} holds {len(live)} live job(s) of another sweep: {named}. This sweep's jobs,"
        " numbered from 0 as well, would take their run dirs. Nothing was queued.",
        f"give this sweep another sweep dir (hydra.sweep.dir=...), or wait until those jobs end"
        f" (hpc-train-report {sweep_dir} --watch), or cancel them: {cancel}.",
    )


def _taken_by_launcher(sweep_dir: Path, launcher: dict) -> ConfigError:
    pid = launcher.get("pid")
    return ConfigError(
        KEY,
        f"the sweep dir {sweep_dir} is in use by a sweep whose launcher still runs (pid {pid} on this host): its jobs"
        " run there one after another, and this sweep's jobs, numbered from 0 as well, would take their run dirs."
        " Nothing was run.",
        f"give this sweep another sweep dir (hydra.sweep.dir=...), or wait until that sweep ends"
        f" (hpc-train-report {sweep_dir} --watch), or stop it (Ctrl-C where it runs, or kill -INT {pid}).",
    )


def _taken_by_local_run(sweep_dir: Path, number: int, overrides: str, recorded: str) -> ConfigError:
    run_dir = Path(sweep_dir) / str(number)
    return ConfigError(
        KEY,
        f"the sweep dir {sweep_dir} holds job #{number} of an earlier sweep ({recorded}), whose run dir {run_dir} this"
        f" sweep's job #{number} ({overrides or 'no overrides'}) would reuse: a run dir holds one run's records."
        " Nothing was run.",
        f"give this sweep another sweep dir (hydra.sweep.dir=...); to go on with that sweep's unfinished jobs, run its"
        f" own command again with hydra.sweep.dir={sweep_dir}.",
    )


def _taken_by_ended(sweep_dir: Path, number: int, overrides: str, earlier: job_table.JobRow) -> ConfigError:
    return ConfigError(
        KEY,
        f"the sweep dir {sweep_dir} holds job #{number} of an earlier sweep ({earlier.overrides or 'no overrides'},"
        f" {earlier.job_id}), whose run dir {Path(sweep_dir) / str(number)} this sweep's job #{number}"
        f" ({overrides or 'no overrides'}) would reuse: a run dir holds one run's records. Nothing was queued.",
        f"give this sweep another sweep dir (hydra.sweep.dir=...); to run that sweep's failed jobs again, use"
        f" hpc-train-report {sweep_dir} --rerun-failed (the table of its jobs: {sweep_dir / rundir.JOB_TABLE}).",
    )
