"""How the ``hpc-train`` command ends on each family of hpc_train.errors, in one table: its exit code, its one message
on stderr, and its refusal as data.

A refusal (an exit code of :data:`REFUSED`) is handed to whoever started the command as data, never as the printed
words: the Python API's child CLI (``cli_child.write_result``, read back by ``cli_child.bad_input``) and the
cluster's CLI of a forwarded command (read back by ``hpc_train.cli``). :func:`as_data` writes it, its family named;
:func:`from_data` gives the same family back on the other side. A job that failed (:class:`JobFailed`) exits with its
own code (the job's: 1, 3 stopped, 4 hung) and its records say why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Type

from hpc_train.errors import (
    ConfigError,
    DiskFull,
    HpcTrainError,
    JobFailed,
    KeyedError,
    RunDirRefused,
    Unreachable,
)
from hpc_train.records.rundir import EXIT_FAILED, EXIT_REFUSED, EXIT_UNREACHABLE


@dataclass(frozen=True)
class Family:
    kind: Type[HpcTrainError]
    name: str  # in the refusal's data
    exit_code: int  # JobFailed: the job's own (err.exit_code)


# Most specific first where one family could hold another (none does today).
FAMILIES = (
    Family(ConfigError, "config", EXIT_REFUSED),
    Family(Unreachable, "unreachable", EXIT_UNREACHABLE),
    Family(RunDirRefused, "run_dir", EXIT_REFUSED),
    Family(DiskFull, "disk_full", EXIT_REFUSED),
    Family(JobFailed, "job_failed", EXIT_FAILED),
)
# The families of a refusal, and their exit codes: the command hands these back as data (a failed job's records say
# why it failed, a rank's refusal included, though the job exits 2 then).
REFUSALS = tuple(family.kind for family in FAMILIES if family.kind is not JobFailed)
REFUSED = frozenset(family.exit_code for family in FAMILIES if family.kind is not JobFailed)


class CliWords(ConfigError):
    """Bad input reported in words of its own (Hydra's, a rank's refusal): the message is that text.

    ``key``: the config key it is about, where the words come with one (a rank's refusal names none)."""

    def __init__(self, text: str, key: str = "") -> None:
        self._text = text.strip()
        super().__init__(key, self._text, "")

    @property
    def message(self) -> str:
        return self._text


def family_of(err: BaseException) -> Optional[Family]:
    """The family `err` belongs to; None for anything else (a bug's traceback, Hydra's own errors)."""
    return next((family for family in FAMILIES if isinstance(err, family.kind)), None)


def exit_code(err: HpcTrainError) -> int:
    """What the command exits with for `err`: its family's code; a failed job's own."""
    if isinstance(err, JobFailed):
        return err.exit_code
    family = family_of(err)
    return family.exit_code if family is not None else EXIT_FAILED


def one_message(err: HpcTrainError) -> str:
    """The one paragraph the command prints for `err` (no traceback): ``hpc-train: `` and what happened, the fix."""
    text = err.message if isinstance(err, KeyedError) else str(err)
    return text if text.startswith("hpc-train") else f"hpc-train: {text}"


def as_data(err: BaseException) -> Dict[str, str]:
    """`err` as the refusal the command hands back: its family, and key, problem and fix (or its words)."""
    family = family_of(err)
    data = {"family": family.name if family is not None else "config"}
    if isinstance(err, KeyedError) and not isinstance(err, CliWords):
        return {**data, "key": err.key, "problem": err.problem, "fix": err.fix}
    words = one_message(err) if isinstance(err, HpcTrainError) else str(err)
    return {**data, "key": getattr(err, "key", "") or "", "words": words}


def from_data(data: Mapping[str, object]) -> HpcTrainError:
    """The error :func:`as_data` wrote, of the same family (a refusal written without one: a ConfigError, as an
    older hpc_train on the cluster writes it)."""
    family = str(data.get("family") or "config")
    key = str(data.get("key") or "")
    if "problem" in data:
        keyed = Unreachable if family == "unreachable" else ConfigError
        return keyed(key, str(data["problem"]), str(data.get("fix") or ""))
    words = str(data.get("words") or "")
    if family == "run_dir":
        return RunDirRefused(words)
    if family == "disk_full":
        return DiskFull(words)
    return CliWords(words, key=key)
