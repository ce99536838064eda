"""ConfigError: bad input found before anything runs, raised by the declarations' engine and the launch side."""

from __future__ import annotations


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
