"""`python -m hpc_train.pack.app_step RUN_FOLDER`: one packed run of a Hydra app's sweep, as a job step.

The app launcher (hpc_train.launch.hydra.app_launcher, ``hydra.launcher.pack.*``) pickles each job's task (an AppTask:
the app's task function, the job's overrides, what every job of the launch shares) into the run's folder; this step
runs it as a submitit job runs it (Hydra's run_job: the job's composed config, working dir and ``.hydra/`` files),
with the packed run's id as ``hydra.job.id``, and leaves the JobReturn beside the task for the waiting launcher.

Exit code: 0 when the task function returned, 1 when it raised; on the allocation's signal (forwarded by its pool)
3 at once, so that the run starts again from the beginning when its allocation is requeued (as submitit reruns a
job's task after a timeout). No torch here, and none imported until the app's own task function does.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path
from typing import List, Optional

from hpc_train.pack import records
from hpc_train.processes.signal_relay import handling
from hpc_train.records import rundir

TASK_FILE = "task.pkl"  # the run's AppTask (cloudpickle), written by the login side before sbatch
RETURN_FILE = "return.pkl"  # its JobReturn (cloudpickle), written by the step's first task


def run_folder(sweep_dir: Path, job: str) -> Path:
    """Where one packed app run keeps its task, its JobReturn and its step's Slurm logs (``slurm/``)."""
    return records.folder(sweep_dir) / "app" / str(job)


def _interrupted(number: int, _frame: object) -> None:
    name = signal.Signals(number).name
    print(
        f"hpc-train: packed run stopped by {name}; it runs again if its allocation is requeued",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(rundir.EXIT_INTERRUPTED)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m hpc_train.pack.app_step SWEEP_DIR/.hpc_train/pack/app/<run>", file=sys.stderr)
        return rundir.EXIT_REFUSED
    folder = Path(argv[0])
    task = pickle.loads((folder / TASK_FILE).read_bytes())
    with handling((signal.SIGUSR1, signal.SIGUSR2), _interrupted):  # until its result is written
        ret = task.run(os.environ.get(records.PACKED_ENV) or os.environ.get("SLURM_JOB_ID", ""))
        if os.environ.get("SLURM_PROCID", "0") == "0":  # as submitit: the first task's result is the job's
            import cloudpickle  # a failed JobReturn carries the task's exception, which plain pickle may not write

            rundir.write_bytes_atomic(cloudpickle.dumps(ret), folder / RETURN_FILE)
        return rundir.EXIT_OK if ret.status.name == "COMPLETED" else rundir.EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
