"""Every error hpc_train raises on purpose, in one tree: catch ``HpcTrainError`` for anything hpc_train refuses or
cannot do, or one family for one kind of trouble.

    HpcTrainError
    ├── ConfigError     a refused configuration: the key, the problem, the fix; nothing ran
    ├── Unreachable     the cluster or a host cannot be reached (ssh failed, refused the login, dropped)
    ├── JobFailed       a job that started (or was queued) and did not finish: its exit code, run dir and logs
    ├── RunDirRefused   a run dir hpc_train will not use (a live job holds it)
    └── DiskFull        a record or a checkpoint a full disk (or quota) kept from being written

``str(err)`` is the whole message: what happened and the fix. The ``hpc-train`` command maps each family to its
exit code and its one-message form in one place (``hpc_train/launch/hydra/exits.py``). The bottom layer: it imports
nothing of hpc_train, so every package can raise these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional


class HpcTrainError(Exception):
    """Anything hpc_train refuses or cannot do; ``str(err)`` says what and the fix."""


class KeyedError(HpcTrainError):
    """The form of a refusal that names the config key to change: ``key``, ``problem``, ``fix`` and ``message``.

    Not a family of its own: :class:`ConfigError` and :class:`Unreachable` take this form, each with its own words.
    """

    heading = "hpc-train: {key}"  # each family's first words, before the problem

    def __init__(self, key: str, problem: str, fix: str) -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return f"{self.heading.format(key=self.key)}: {self.problem} Fix: {self.fix}"


class ConfigError(KeyedError):
    """Bad input found before anything runs or is queued.

    Always names the offending config key and the fix, so the message alone is enough
    for a user to correct the command line.
    """

    heading = "hpc-train: invalid configuration for `{key}`"


class Unreachable(KeyedError):
    """The cluster (or a host) cannot be reached: ssh failed, the host refused the login or its key, the connection
    dropped. ``key`` is the setting that names the host (``cluster.login``); nothing is wrong with the config's
    values, and the same command may work once the network (or the key, or the VPN) is back."""

    heading = "hpc-train: cannot reach the cluster (`{key}`)"


class JobFailed(HpcTrainError):
    """A job that started (or was queued) and did not finish.

    ``exit_code`` is what the CLI exits with: the worker's code locally (3: stopped after a
    checkpoint), 1 for a failed Slurm job. ``error`` holds the failing rank's one-line cause
    when one is known; ``run_dir`` the job's run dir (its records) and ``logs`` the folder of its logs, when known.
    """

    def __init__(
        self,
        message: str,
        exit_code: int = 1,
        error: Optional[str] = None,
        reported: bool = False,
        run_dir: Optional[Path] = None,
        logs: Optional[Path] = None,
    ) -> None:
        self.exit_code = exit_code
        self.error = error
        self.reported = reported  # the launcher already printed what failed and where the logs are
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.logs = Path(logs) if logs is not None else None
        super().__init__(message)


class RunDirRefused(HpcTrainError):
    """A run dir hpc_train will not use; ``run_dir`` names it, ``str(err)`` says why and the fix."""

    run_dir: Optional[Path] = None


class DiskFull(HpcTrainError):
    """A record or a checkpoint that a full disk (ENOSPC) or a quota (EDQUOT) kept from being written; what was
    there before stays. ``str(err)`` names the file, what was kept and the fix (free space, run the same command)."""
