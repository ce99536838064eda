"""A Slurm job's outer process on its batch host: it starts the job step, relays Slurm's signals to it, and acts on
what the ranks ask once the step has ended.

The batch script ``exec``s it (so ``#SBATCH --signal=B:SIG@S`` reaches it) with the step's command after ``--``::

    python -m hpc_train.batchhost.agent --requests FOLDER [--unset NAME] [--set NAME=VALUE] -- srun ... python ...

It runs with the launching environment's Python, never in the image, so every Slurm command is the batch host's:
the ranks (perhaps in a container without ``scontrol``) write one request (hpc_train.records.job_requests) and this
process requeues the job (``scontrol requeue``, and ``ExcNodeList`` for a hang's nodes) or ends it with the image's
refusal. A stop signal is passed on to the step (srun passes it to every task); the step's exit status is the job's.
Imports no torch.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from hpc_train.containers.base import IMAGE_VARIABLE, LAUNCH_PREFIX_VARIABLE
from hpc_train.processes.signal_relay import RELAYED, handling, relay_to
from hpc_train.records import job_requests
from hpc_train.records.run_claim import slurm_job_id
from hpc_train.records.rundir import EXIT_REFUSED
from hpc_train.slurm.requeue import requeue_job

WAIT_FOR_REQUEUE_S = 300.0  # after scontrol requeue, Slurm ends this process: do not report an exit first


def request_path(folder: Path, env=os.environ) -> Path:
    """One file per job (an array task's own SLURM_JOB_ID): the ranks write it, this process reads it."""
    return Path(folder).absolute() / f"{env.get('SLURM_JOB_ID') or os.getpid()}_request.json"


def parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hpc_train.batchhost.agent")
    parser.add_argument("--requests", required=True, help="the folder of the ranks' request file")
    parser.add_argument("--unset", action="append", default=[], help="a variable the step does not get")
    parser.add_argument("--set", action="append", default=[], help="NAME=VALUE the step gets")
    parser.add_argument("--replicas", default=None, help="replica groups: their plan (JSON); one step per group")
    parser.add_argument("step", nargs=argparse.REMAINDER, help="-- then the job step's command")
    args = parser.parse_args(argv)
    args.step = args.step[1:] if args.step[:1] == ["--"] else args.step
    if not args.step:
        parser.error("give the job step's command after --")
    return args


def step_environment(args: argparse.Namespace, path: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in set(args.unset)}
    for item in args.set:
        key, _, value = item.partition("=")
        env[key] = value
    env[job_requests.REQUESTS_VARIABLE] = str(path)
    env[LAUNCH_PREFIX_VARIABLE] = sys.prefix
    return env


def run_step(command: List[str], env: dict) -> int:
    """Start the step and pass every stop signal on until it ends; its exit status."""
    # Found with this process's PATH: the step's may be the image's (Slurm's OCI support), without srun on it.
    step = subprocess.Popen([shutil.which(command[0]) or command[0], *command[1:]], env=env)
    with handling(RELAYED, relay_to([step])):
        while True:
            try:
                return step.wait()
            except InterruptedError:  # a relayed signal woke the wait
                continue


def act(path: Path, code: int, image: str = "") -> int:
    """What the ranks asked, done; the job's exit status. `image`: the container's, whose entry every rank runs
    first; a failed step in which no rank got that far had no Python to run it."""
    record = job_requests.read(path)
    if record is None and image and code != 0 and not job_requests.started_file(path).exists():
        print(
            f"hpc-train: the image {image} cannot run hpc_train's ranks: no rank started its Python (`python3` on the"
            " image's PATH). Fix: use an image with Python and torch (container.image=...); the step's own words are"
            " in the job's Slurm logs.",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_REFUSED
    if record is None:
        return code
    if record["action"] == job_requests.REFUSE:
        print(record.get("message") or "hpc-train: the image cannot run the ranks", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    job = slurm_job_id()
    if job is None:
        print("hpc-train: not requeued: this process runs outside a Slurm job", file=sys.stderr, flush=True)
        return code
    # The requeue ends this job with SIGTERM: what was done is said first, and this process then waits to be ended.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    done, text = requeue_job(job, list(record.get("exclude") or []))
    print(f"hpc-train: {text}", file=sys.stderr, flush=True)
    if done:  # Slurm stops this job now; waiting keeps its state REQUEUED rather than a finished one
        time.sleep(WAIT_FOR_REQUEUE_S)
    return code


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    path = request_path(Path(args.requests))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a requeued job keeps its id: last attempt's request is done
    job_requests.started_file(path).unlink(missing_ok=True)
    env = step_environment(args, path)
    if args.replicas:  # fault_tolerance.replica_groups: the lighthouse and one step per group (batchhost/groups.py)
        from hpc_train.batchhost.groups import run_groups  # only a job of replica groups needs it

        code = run_groups(args.replicas, args.step, env)
    else:
        code = run_step(args.step, env)
    return act(path, code, env.get(IMAGE_VARIABLE, ""))


if __name__ == "__main__":
    sys.exit(main())
