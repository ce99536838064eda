"""How many jobs a sweep may queue, read from the cluster before anything is queued.

Three Slurm limits refuse a big sweep at ``sbatch`` time, part-way, with terse words:

* ``MaxArraySize`` (``scontrol show config``; default 1001): an array's task ids must stay
  below it. Sweeps are cut into arrays of at most ``MaxArraySize - 1`` tasks (:func:`array_chunk`).
* ``MaxJobCount`` (default 10,000): jobs the controller holds, every array task counted.
* ``MaxSubmitJobs`` of the user's association (``sacctmgr``): jobs the user may have queued.

:func:`check_sweep_fits` compares the sweep with the last two and refuses, naming the limit,
the counts and the fix, before the first ``sbatch``. ``MaxJobs`` (jobs running at once) does not
refuse anything: the excess waits (reason ``AssocMaxJobsLimit``); the user is told, and
``launcher.array_parallelism`` throttles the arrays instead. Where a command does not answer
(no Slurm, no accounting) its limit is not checked; QoS limits are left to Slurm.
"""

from __future__ import annotations

import getpass
import os
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

from hpc_train.config.errors import ConfigError
from hpc_train.slurm import slurm_cli

DEFAULT_MAX_ARRAY_SIZE = 1001  # Slurm's default, used when scontrol does not answer
SWEEP_KEY = "sweep"  # the key a refusal names: the sweep as a whole, not one job's setting


@slurm_cli.remembered
def controller_config() -> Dict[str, str]:
    """``scontrol show config`` as {name: value}, asked once per command (slurm_cli.remembered); {} when it does not
    answer."""
    text = slurm_cli.query(["scontrol", "show", "config"], timeout=30) or ""
    found: Dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() and " " not in name.strip():
            found[name.strip()] = value.strip()
    return found


def _int(value: Optional[str]) -> Optional[int]:
    try:
        return int(str(value).split()[0])
    except (ValueError, IndexError):
        return None


def array_chunk() -> int:
    """Tasks per job array: MaxArraySize - 1 (task ids 0..N-1 stay below it); one job per sbatch where arrays are
    off."""
    size = _int(controller_config().get("MaxArraySize"))
    return max(1, (size if size is not None else DEFAULT_MAX_ARRAY_SIZE) - 1)


@dataclass(frozen=True)
class Association:
    account: str
    partition: str
    max_submit_jobs: Optional[int]
    max_jobs: Optional[int]
    default: bool  # the user's default account: where a job that names none is charged


def user() -> str:
    return os.environ.get("USER") or getpass.getuser()


def associations(name: str) -> List[Association]:
    """The user's associations with their job-count limits, and which account is their default (one ``sacctmgr``
    call); [] without accounting."""
    text = slurm_cli.query(
        [
            "sacctmgr",
            "-n",
            "-P",
            "show",
            "user",
            name,
            "withassoc",
            "format=defaultaccount,account,partition,maxsubmitjobs,maxjobs",
        ],
        timeout=30,
    )
    rows = []
    for line in (text or "").splitlines():
        fields = line.strip().split("|")
        if len(fields) == 5:
            rows.append(Association(fields[1], fields[2], _int(fields[3]), _int(fields[4]), fields[1] == fields[0]))
    return rows


def queued_jobs(name: Optional[str] = None) -> Optional[int]:
    """Jobs in the controller (of user `name`), each array task counted; None when squeue does not answer."""
    command = ["squeue", "-h", "-r", "-o", "%i"] + (["-u", name] if name else [])
    text = slurm_cli.query(command, timeout=30)
    return None if text is None else len([line for line in text.splitlines() if line.strip()])


def _split_fix(room: int) -> str:
    if room <= 0:
        return "wait until some of your queued jobs have finished (squeue --me), or scancel some, then submit again."
    return (
        f"submit the sweep in parts of at most {room:,} jobs (e.g. seed=range(0,{room}) now, the rest once they have"
        " finished), or ask your admins to raise the limit."
    )


def check_sweep_fits(count: int, accounts: Iterable[Optional[str]], throttle: Optional[int]) -> None:
    """Refuse a sweep of `count` jobs that MaxJobCount or the user's MaxSubmitJobs cannot take; note MaxJobs."""
    limit = _int(controller_config().get("MaxJobCount"))
    if limit is not None:
        held = queued_jobs()
        if held is not None and held + count > limit:
            raise ConfigError(
                SWEEP_KEY,
                f"this sweep queues {count:,} jobs and the cluster holds {held:,}, over its MaxJobCount of {limit:,}"
                " (`scontrol show config`; every array task counts).",
                _split_fix(limit - held),
            )
    name = user()
    rows = associations(name)
    # a job that names no account is charged to the default one: only that association's limits apply to it
    default = next((r.account for r in rows if r.default), None)
    wanted = {account or default for account in set(accounts)} - {None}
    mine = [r for r in rows if not wanted or r.account in wanted] or rows
    submit_limits = [r for r in mine if r.max_submit_jobs is not None]
    if submit_limits:
        row = min(submit_limits, key=lambda r: r.max_submit_jobs or 0)
        mine_queued = queued_jobs(name) or 0
        assert row.max_submit_jobs is not None
        if mine_queued + count > row.max_submit_jobs:
            raise ConfigError(
                SWEEP_KEY,
                f"this sweep queues {count:,} jobs and you have {mine_queued:,} queued, over the MaxSubmitJobs of"
                f" {row.max_submit_jobs:,} of your association (user {name}, account {row.account};"
                f" `sacctmgr show assoc user={name}`).",
                _split_fix(row.max_submit_jobs - mine_queued),
            )
    run_limits = [r.max_jobs for r in mine if r.max_jobs is not None]
    if run_limits and count > min(run_limits) and (throttle is None or throttle > min(run_limits)):
        print(
            f"hpc-train: note: your association runs at most {min(run_limits):,} jobs at once (MaxJobs); the other"
            f" jobs of this sweep wait with reason AssocMaxJobsLimit. launcher.array_parallelism={min(run_limits)}"
            " throttles each array to that.",
            file=sys.stderr,
        )
