"""`python -m hpc_train.compute.worker JOB_CONFIG.yaml`: one rank of a job.

The local launcher and the plain sbatch scripts start it once per task.

Exit codes (hpc_train.records.rundir): EXIT_OK; EXIT_FAILED (traceback in logs/rank<r>.log and on
stderr); EXIT_REFUSED (one message, no traceback: e.g. the job was planned for another number
of ranks, or the checkpoint is unsafe or from an older hpc-train); EXIT_INTERRUPTED (stopped by
a signal after a checkpoint: resumed as hpc_train.records.rundir.resume_hint says). Under a plain sbatch
script, the requeue signal makes rank 0 requeue the job itself (``scontrol requeue``).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from pathlib import Path

from omegaconf import DictConfig

from hpc_train.compute.entry.script_job import ScriptFailed
from hpc_train.compute.entry.train import load_job_spec, train
from hpc_train.compute.runtime.interrupts import REQUEUE, TrainingInterrupted
from hpc_train.compute.runtime.refusal import REFUSALS
from hpc_train.compute.runtime.requeue import requeue_after_stop
from hpc_train.pack.records import PACKED_ENV
from hpc_train.records.rundir import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_REFUSED, resume_hint


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m hpc_train.compute.worker RUN_DIR/job_config.yaml", file=sys.stderr)
        return EXIT_REFUSED
    return run_spec(load_job_spec(Path(argv[0])))


def run_spec(spec: DictConfig) -> int:
    """Train as this process's rank of the job `spec`; returns the exit code (see the module doc)."""
    try:
        train(spec)
    except ScriptFailed as failed:  # the user's script failed: what and where, no traceback of ours
        print(f"hpc-train: {failed}", file=sys.stderr)
        return EXIT_FAILED
    except REFUSALS as refusal:  # one line, no traceback (rank 0's log has already put it on the console)
        if not refusal.on_console:
            print(f"hpc-train: {refusal}", file=sys.stderr)
        return EXIT_REFUSED
    except TrainingInterrupted as stop:
        if stop.request == REQUEUE and os.environ.get("SLURM_JOB_ID"):
            if requeue_after_stop(stop, Path(spec.job.run_dir), int(spec.trainer.max_requeues)):
                print(f"hpc-train: {stop}; the batch host requeues the job", file=sys.stderr)
                return EXIT_OK
        if os.environ.get(PACKED_ENV):
            print(f"hpc-train: {stop}; this packed run resumes when its allocation starts again", file=sys.stderr)
        else:
            print(f"hpc-train: {stop}; {resume_hint(Path(spec.job.run_dir))}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as stop:  # sys.exit() in the user's code: its status must not pass for one of ours
        print(f"hpc-train: the training code called sys.exit({stop.code!r}) before training finished", file=sys.stderr)
        return EXIT_FAILED
    except Exception:  # the traceback is already in logs/rank<r>.log and on stderr below
        traceback.print_exc()
        return EXIT_FAILED
    return EXIT_OK


def exit_now(code: int) -> None:
    """Leave without the interpreter's finalization, which a finished rank does not need.

    Every rank first does what Python does at exit before finalizing: it waits for its non-daemon
    threads and runs the exit handlers (logging's, the trackers', the user's); then it flushes and
    leaves. Finalization proper (tearing down thousands of modules and libtorch's static
    destructors) takes about a second per rank at the end of every job, and with process groups
    still alive it can abort a finished rank ("terminate called without an active exception").
    A failed rank skips the threads and handlers too: its process group may own communication
    threads whose peers are going away at the same moment, and its traceback is already written.
    """
    if code != EXIT_FAILED:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
        atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
