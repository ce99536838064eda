"""The task of a replica group's job step: submitit's submitted callable, run as submitit runs it, with no result file.

``python -m hpc_train.compute.entry.group_task FOLDER`` stands in a group's step (hpc_train.batchhost.groups) where
``-m submitit.core._submit FOLDER`` stands in a job's one step. submitit names a task's result file by the job id and
the task's rank in its step (``<job>_<rank>_result.pkl``, written through ``<...>.save_tmp``): every group's step has
a task of rank 0, so the groups would all write one file through one temporary path, and the step that lost the race
failed after training (``FileNotFoundError: No file was saved at the temporary path``). A group's return value is no
job's outcome: the job's end is Slurm's state and the run's records (hpc_train.launch.backends.slurm.follow), so a
group's task writes none. A failure raises as under submitit: its traceback in the step's ``.err`` log, its rank's
error record in the run dir. Imports no torch itself (the callable does, once it runs).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from submitit.core.job_environment import JobEnvironment
from submitit.core.logger import get_logger
from submitit.core.utils import DelayedSubmission

SUBMITTED_WAIT_S = 60  # submitit's own wait for the submitted pickle (a slow shared file system)


def main(folder: str) -> None:
    os.environ["SUBMITIT_FOLDER"] = str(folder)  # where submitit's JobEnvironment finds the job's files
    env = JobEnvironment()
    submitted = Path(env.paths.submitted_pickle)
    get_logger().info(f"Starting with {env} (a replica group's task: no result file)")
    deadline = time.monotonic() + SUBMITTED_WAIT_S
    while not submitted.exists() and time.monotonic() < deadline:
        time.sleep(1)
    delayed = DelayedSubmission.load(submitted)
    # submitit's signal handlers, as its own entry installs them: a rank's stop flag reads its timeout handler
    env._handle_signals(env.paths, delayed)
    delayed.result()
    get_logger().info("Job completed successfully")


if __name__ == "__main__":
    main(sys.argv[1])
