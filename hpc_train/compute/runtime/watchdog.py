"""What the watching rank does once no rank has advanced for the hang timeout (hpc_train.compute.runtime.heartbeat).

1. asks every rank for its stacks (``logs/hang.json``) and waits for them (hpc_train.records.hang.STACKS_WAIT_S);
2. names the culprits and the ranks that only wait for them (hpc_train.records.hang.diagnose), in one
   message: on the job's output, in the rank's log, in ``attempts.jsonl`` (``how: hang``) and as
   the culprit's failure record (``logs/rank<r>.error.json``, timed at its last advance, so
   hpc-train-report and the launcher blame it and not a peer that timed out later);
3. with ``trainer.requeue_on_hang=true`` on Slurm, asks the batch host to requeue the job once (not
   after an attempt that itself ended in a hang), excluding the culprits' nodes (``scontrol update
   ExcNodeList``) unless they are all of the job's nodes;
4. tells every rank to exit with EXIT_HUNG.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from hpc_train.compute.runtime import attempts
from hpc_train.compute.runtime.runlog import log_to_file
from hpc_train.pack.records import PACKED_ENV
from hpc_train.records import hang, job_requests, rundir
from hpc_train.records.metrics_log import LOCAL_LAUNCHER_VARIABLE
from hpc_train.records.rank_errors import write_record

log = logging.getLogger("hpc_train")

HANG = "hang"  # how an attempt ended, in attempts.jsonl


def act_on_hang(
    run_dir: Path,
    records: Dict[int, hang.RankProgress],
    limit: float,
    requeue_on_hang: bool,
    by: int,
    dump_own: Callable[[str], None],
    group: Optional[int] = None,
) -> str:
    """Collect the stacks, blame, record, maybe requeue, and tell every rank to stop; returns the message. A replica
    group's (`group`): its ranks alone dump and stop; the attempt goes on and nothing is requeued (its launcher
    restarts the group, which rejoins the others)."""
    asked = hang.request(run_dir, hang.DUMPING, by=by, group=group)
    stamp = hang.stamp(asked)
    dump_own(stamp)
    stacks = _collect_stacks(run_dir, sorted(records), stamp)
    verdict = hang.diagnose(records, stacks, now=asked)
    message = hang.describe(verdict, records, stacks, limit, run_dir)
    if group is not None:
        message = message.replace("hpc-train: ", f"hpc-train: replica group {group}: ", 1)
    log_to_file(message.removeprefix("hpc-train: "))
    if not os.environ.get(LOCAL_LAUNCHER_VARIABLE):  # the local launcher prints it itself, from hang.json
        print(message, file=sys.stderr, flush=True)
    first = min(verdict.culprits, key=lambda r: records[r].since)
    culprit = records[first]
    write_record(
        run_dir, first, f"hung in {culprit.where()} (no progress for {verdict.stalled_s:.0f} s)", when=culprit.since
    )
    if group is None:
        attempts.end_current(run_dir, HANG, max(0, culprit.step - 1), detail=message)
    requeued = ""
    if requeue_on_hang and group is None:
        requeued = _requeue(
            run_dir, sorted({records[r].host for r in verdict.culprits}), sorted({r.host for r in records.values()})
        )
    hang.request(
        run_dir,
        hang.STOPPING,
        by=by,
        message=message + (f"\n  {requeued}" if requeued else ""),
        culprits=verdict.culprits,
        waiting=verdict.waiting,
        requeued=bool(requeued.startswith("requeued")),
        group=group,
    )
    return message


def _collect_stacks(run_dir: Path, ranks: List[int], stamp: str) -> Dict[int, Optional[hang.RankStacks]]:
    """Every rank's dump of this request, as it arrives, until all are there or the wait is over."""
    stacks: Dict[int, Optional[hang.RankStacks]] = {rank: None for rank in ranks}
    deadline = time.monotonic() + hang.STACKS_WAIT_S
    while True:
        for rank in [r for r, s in stacks.items() if s is None]:
            try:
                text = rundir.rank_log(run_dir, rank).read_text(errors="replace")
            except OSError:
                continue
            stacks[rank] = hang.parse_stacks(text, rank, stamp)
        if all(s is not None for s in stacks.values()) or time.monotonic() > deadline:
            return stacks
        time.sleep(0.2)


def _requeue(run_dir: Path, culprit_hosts: List[str], job_hosts: List[str]) -> str:
    """Ask the batch host to requeue this Slurm job once, away from the culprits' nodes; what was done, in words
    (logged too). The batch host runs ``scontrol`` once the step has ended (hpc_train.batchhost.agent)."""
    if not os.environ.get("SLURM_JOB_ID"):
        text = "not requeued: trainer.requeue_on_hang applies to Slurm jobs (this is a local run)"
    elif os.environ.get(PACKED_ENV):
        text = "not requeued: a packed run does not requeue its allocation (the other runs go on); this run ends hung"
    elif job_requests.request_file() is None:
        text = (
            "not requeued: no batch-host agent started this job step (a batch script of your own: exec"
            " `python -m hpc_train.batchhost.agent --requests DIR -- srun ...` as sbatch/*.slurm do)"
        )
    elif any(r.get("how") == HANG for r in rundir.read_attempts(run_dir)[:-1] if r.get("event") == "end"):
        text = (
            "not requeued: an earlier attempt of this run ended in a hang already"
            " (trainer.requeue_on_hang requeues once)"
        )
    else:
        exclude = culprit_hosts if set(culprit_hosts) != set(job_hosts) else []
        job_requests.write(job_requests.REQUEUE, exclude=exclude, why=HANG)
        away = f", excluding node {','.join(exclude)}" if exclude else " (every node was stuck: none excluded)"
        text = f"requeued: the batch host requeues the job once the ranks have stopped{away}"
    log.warning("%s", text)
    return text
