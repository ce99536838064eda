"""The unit tier's promise, enforced: a test under tests/unit that starts a process fails at that very call.

Every way a test starts one goes through these: subprocess (and so the hpc-train CLI, run_python, torchrun, nbclient's
kernel), os.fork/forkpty/posix_spawn/system, and multiprocessing (torch.multiprocessing spawn included).
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
from typing import Any, Callable, Iterator

import pytest

WHERE_TO = "tests/unit holds tests that start no process: move this one to tests/e2e (or tests/slurm)"


class ProcessStarted(BaseException):
    """A unit test started a process. A BaseException, so the code under test cannot swallow it as an error."""


def _refuse(what: str, command_at: int = -1) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        command = f" {args[command_at]!r}" if 0 <= command_at < len(args) else ""
        raise ProcessStarted(f"{what}{command}: {WHERE_TO}")

    return refused


@contextlib.contextmanager
def processes_refused() -> Iterator[None]:
    """While inside, starting a process raises ProcessStarted naming the call (and the command, where there is one)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", _refuse("subprocess.Popen", command_at=1))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            patch.setattr(os, name, _refuse(f"os.{name}", command_at=0 if name == "system" else 1), raising=False)
        patch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("multiprocessing's Process.start"))
        yield
