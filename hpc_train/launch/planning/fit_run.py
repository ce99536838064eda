"""The memory estimate of job specs, from the login side: ``python -m hpc_train.compute.fit`` run as a process of its
own (the login side never imports torch), its JSON read back.

:func:`estimate` writes the job specs into a temporary folder and asks one process for all of them (``--serve``: one
request a line on its stdin, one JSON answer a spec on its stdout; :class:`Session`, which the calls inside
:func:`session` share), and returns, per spec, the estimate (``hpc_train.compute.fit.breakdown.JobEstimate.as_dict``:
{"layout", "seconds", "ranks": [...], "floor"}; with ``floor`` set, the least its largest rank holds, where that is
over the spec's budget), a :class:`Refused` (the estimate cannot simulate that job, in its own words) or a
:class:`Skipped` (enough specs before it fit). A process that fails otherwise (a crash, no torch) raises
:class:`EstimateFailed`, a ConfigError naming ``resources.memory_check`` with the command and what it printed on
stderr.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from hpc_train.errors import ConfigError
from hpc_train.launch.planning.jobspec import write_yaml

ESTIMATE_MODULE = "hpc_train.compute.fit"  # python -m ESTIMATE_MODULE --serve
CHECK_KEY = "resources.memory_check"  # the key that turns the check off, named by every failure of the estimate
STDERR_LINES = 20  # the last lines of a failed estimate's stderr quoted in the error
CLOSE_TIMEOUT_S = 30  # a session's process, terminated, ends within this (else it is killed)


@dataclass(frozen=True)
class Refused:
    """The estimate could not simulate this job spec; ``reason`` is its one line (what, and the fix)."""

    reason: str


@dataclass(frozen=True)
class Skipped:
    """Not estimated: enough specs before it fit their budgets (``enough``)."""

    reason: str


Estimate = Union[Dict[str, Any], Refused, Skipped]


class EstimateFailed(ConfigError):
    """The estimate's process failed for another reason than a refusal: the command and its stderr."""

    def __init__(self, command: Sequence[str], code: int, stderr: str) -> None:
        lines = stderr.strip().splitlines()
        tail = "\n".join(lines[-STDERR_LINES:])
        self.last_line = _error_line(lines) or f"exit code {code}"
        super().__init__(
            CHECK_KEY,
            f"the memory estimate failed (exit code {code}): {' '.join(command)}\n{tail}\n",
            f"fix what it printed, or set {CHECK_KEY}=never to queue the job without the check.",
        )


@dataclass(frozen=True)
class Ask:
    """How the specs are estimated: `workers` processes at once; each rank's step costs too (`costs`); per spec, the
    bytes of tensors its GPU holds (`budgets`: a spec whose floor is over it is answered with the floor); stop once
    `enough` specs fit their budgets (the rest Skipped)."""

    workers: int = 1
    costs: bool = False
    budgets: Optional[Sequence[int]] = None
    enough: Optional[int] = None

    def one(self, index: int) -> "Ask":
        """The same for the spec at `index` alone."""
        budgets = None if self.budgets is None else [self.budgets[index]]
        return Ask(1, self.costs, budgets, None)


def estimate(specs: Sequence[Dict[str, Any]], ask: Ask = Ask(), failed_refuses: bool = False) -> List[Estimate]:
    """Each job spec's estimate (or Refused, or Skipped), in order, from one process running the estimate.

    `failed_refuses` (the settings tried beside a job, which a crash of one must not hide): a process that fails
    other than by refusing is run again one spec at a time, and a spec whose process still fails is refused with its
    last line, instead of raising EstimateFailed."""
    if not specs:
        return []
    try:
        return _run(specs, ask)
    except EstimateFailed as failed:
        if not failed_refuses:
            raise
        if len(specs) == 1:
            return [Refused(f"the estimate failed: {failed.last_line}")]
        return [answer for i, spec in enumerate(specs) for answer in estimate([spec], ask.one(i), failed_refuses)]


def _run(specs: Sequence[Dict[str, Any]], ask: Ask) -> List[Estimate]:
    """The answers of the session open now (session()), or of a process for this call alone."""
    with session():
        if _scope.session is None:
            _scope.session = Session()
        try:
            return _scope.session.ask(specs, ask)
        except EstimateFailed:
            _scope.session.close()
            _scope.session = None  # a retry, or the next call, starts a process of its own
            raise


class Session:
    """One estimate process for several calls (``python -m hpc_train.compute.fit --serve``): torch imported once, and
    what the process made (each model's floor, the data's batches) kept from one call to the next."""

    def __init__(self) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="hpc-train-fit-")
        self.stderr = open(Path(self.folder.name) / "stderr", "w+")  # noqa: SIM115 (closed by close())
        self.command = [sys.executable, "-m", ESTIMATE_MODULE, "--serve"]
        self.process = subprocess.Popen(
            self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True
        )
        self.written = 0

    def ask(self, specs: Sequence[Dict[str, Any]], ask: Ask) -> List[Estimate]:
        """Each spec's answer, from the process (EstimateFailed where it ends before answering)."""
        paths = []
        for spec in specs:
            paths.append(str(write_yaml(spec, Path(self.folder.name) / f"spec{self.written}.yaml")))
            self.written += 1  # each spec a path of its own: the process keeps what it read by path
        request = {
            "paths": paths,
            "workers": max(1, ask.workers),
            "costs": ask.costs,
            "budgets": ask.budgets,
            "enough": ask.enough,
        }
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            self._failed()
        answers = []
        while len(answers) < len(specs):
            line = self.process.stdout.readline()
            if not line:
                self._failed()
            if line.startswith("{"):  # not what the user's code prints
                answers.append(_answer(json.loads(line)))
        return answers

    def _failed(self) -> None:
        code = self.process.wait()
        self.stderr.seek(0)
        raise EstimateFailed(self.command, code, self.stderr.read())

    def close(self) -> None:
        """Ends the process, which has nothing left to do (its answers are read, it keeps nothing; torch's own exit
        would take a second), and removes its files."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except BrokenPipeError:
                pass
        self.process.terminate()
        try:
            self.process.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr.close()
        self.folder.cleanup()


class _Scope:
    """Whether estimate() calls share a Session now (session()), and the one they share, once started."""

    def __init__(self) -> None:
        self.open = False
        self.session: Optional[Session] = None


_scope = _Scope()


@contextlib.contextmanager
def session() -> Iterator[None]:
    """The estimate() calls inside share one estimate process, started by the first of them (none starts one where
    no estimate is asked for) and ended at the end."""
    if _scope.open:  # inside one already: it is shared
        yield
        return
    _scope.open = True
    try:
        yield
    finally:
        _scope.open = False
        if _scope.session is not None:
            _scope.session.close()
            _scope.session = None


def _answer(data: Dict[str, Any]) -> Estimate:
    if "refused" in data:
        return Refused(str(data["refused"]))
    if "skipped" in data:
        return Skipped(str(data["skipped"]))
    return data


def _error_line(lines: Sequence[str]) -> str:
    """The line of a traceback that says what went wrong (its last ``SomethingError: ...``, without torch's
    ``[rank0]:`` prefix), else the last line."""
    errors = [line for line in lines if _ERROR.match(line.removeprefix("[rank0]: ").strip())]
    chosen = errors[-1] if errors else (lines[-1] if lines else "")
    return chosen.removeprefix("[rank0]: ").strip()


_ERROR = re.compile(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b.*:")
