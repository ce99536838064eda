"""The exceptions the launch side raises, and how they are shown."""

from __future__ import annotations

from typing import Optional


class ConfigError(Exception):
    """Bad input found before anything runs or is queued.

    Always names the offending config key and the fix, so the message alone is enough
    for a user to correct the command line.
    """

    def __init__(self, key: str, problem: str, fix: str) -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return f"hpc-train: invalid configuration for `{self.key}`: {self.problem} Fix: {self.fix}"


class JobFailed(Exception):
    """A job that started (or was queued) and did not finish.

    ``exit_code`` is what the CLI exits with: the worker's code locally (3: stopped after a
    checkpoint), 1 for a failed Slurm job. ``error`` holds the failing rank's one-line cause
    when one is known.
    """

    def __init__(self, message: str, exit_code: int = 1, error: Optional[str] = None, reported: bool = False) -> None:
        self.exit_code = exit_code
        self.error = error
        self.reported = reported  # the launcher already printed what failed and where the logs are
        super().__init__(message)
