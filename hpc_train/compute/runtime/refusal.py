"""Errors whose message is the whole story: a rank reports them as one line and exits with
hpc_train.records.rundir.EXIT_REFUSED, no traceback.

Raised for what the user must change rather than what broke (a world size the job was not
planned for, a checkpoint that is unsafe or from an older hpc-train). A traceback would only
hide the message.
"""

from __future__ import annotations

from hpc_train.errors import DiskFull, HpcTrainError


class Refusal(HpcTrainError, RuntimeError):
    """This rank will not run; ``str(err)`` says why and what to do."""

    on_console = False  # set once the message went to the console (rank 0's log does), so it is not printed twice


# What a rank reports as one line and EXIT_REFUSED: its refusals, and a record or a checkpoint that a full disk kept
# from being written (hpc_train.records.rundir.recording, the checkpoint's own DiskFull).
REFUSALS = (Refusal, DiskFull)
