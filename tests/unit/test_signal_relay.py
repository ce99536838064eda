"""hpc_train.processes.signal_relay: a handler for the length of a block, the previous one back after it (nested
blocks, an exception, a KeyboardInterrupt raised by the handler itself), nothing installed off the main thread."""

from __future__ import annotations

import ast
import os
import signal
import threading
from pathlib import Path
from typing import List, Tuple

import pytest

import hpc_train
from hpc_train.processes.signal_relay import handling, relay_to

SIG = signal.SIGUSR1


def _raise(signum: int, _frame: object) -> None:
    raise LookupError(f"signal {signum} reached the handler")


def _deliver(signum: int = SIG) -> None:
    """Send `signum` to this process; Python runs its handler before the next line in the main thread."""
    os.kill(os.getpid(), signum)


@pytest.fixture
def outside():
    """The test's own handler for SIG, and the one before it back after the test."""
    seen = []
    before = signal.signal(SIG, lambda signum, _frame: seen.append(("outside", signum)))
    yield seen
    signal.signal(SIG, before)


def test_nested_blocks_each_hand_back_what_they_found(outside):
    seen = outside
    found = signal.getsignal(SIG)
    with handling([SIG, signal.SIGUSR2], lambda signum, _frame: seen.append(("outer", signum))) as installed:
        assert installed
        outer = signal.getsignal(SIG)
        with handling([SIG], lambda signum, _frame: seen.append(("inner", signum))):
            _deliver()
        assert signal.getsignal(SIG) is outer
        _deliver()
        _deliver(signal.SIGUSR2)
    assert signal.getsignal(SIG) is found
    _deliver()
    assert seen == [("inner", SIG), ("outer", SIG), ("outer", signal.SIGUSR2), ("outside", SIG)]


def test_the_handlers_come_back_after_an_exception_even_one_the_handler_raised(outside):
    found = signal.getsignal(SIG)
    with pytest.raises(RuntimeError):
        with handling([SIG], signal.SIG_IGN):
            raise RuntimeError("the block failed")
    assert signal.getsignal(SIG) is found
    with pytest.raises(LookupError, match="reached the handler"):
        with handling([SIG], _raise):
            _deliver()
    assert signal.getsignal(SIG) is found


def test_off_the_main_thread_the_block_runs_and_nothing_is_installed(outside):
    """signal.signal raises ValueError outside the main thread: the work must still be done there (the Python API in
    a worker thread), with the process's handlers as they were."""
    found = signal.getsignal(SIG)
    results = []

    def work() -> None:
        try:
            with handling([SIG, signal.SIGINT], _raise) as installed:
                results.append(("ran", installed, signal.getsignal(SIG) is found))
        except BaseException as error:  # what the thread would have died of
            results.append(("failed", repr(error)))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert results == [("ran", False, True)]
    assert signal.getsignal(SIG) is found


class _Child:
    """A child process as relay_to sees it (poll, send_signal): running until told otherwise."""

    def __init__(self, running: bool = True) -> None:
        self.running, self.received = running, []

    def poll(self):
        return None if self.running else 0

    def send_signal(self, signum: int) -> None:
        self.received.append(signum)


def test_relay_passes_the_signal_to_the_children_still_running_including_those_added_later(outside):
    children = [_Child(), _Child(running=False)]
    with handling([SIG], relay_to(children)):
        children.append(_Child())
        _deliver()
    assert [child.received for child in children] == [[SIG], [], [SIG]]
    assert outside == []


# -- the one place: no module of the package sets a signal's handler by hand ---------------------------------------
PACKAGE = Path(hpc_train.__file__).parent
RELAY = "processes/signal_relay.py"
# (module, function) -> why it sets a disposition itself rather than through `handling` for a block: each sets one for
# the rest of a process's life (a child's before exec, a forked rank's start, a process's last moments), never a
# handler to be put back.
OWN_DISPOSITIONS = {
    ("compute/entry/script_job.py", "preexec"): "in the user's script before exec: its requeue signal ignored for"
    " its whole life (a disposition that survives exec)",
    ("compute/runtime/fork_server.py", "_reset_signals"): "a forked warm rank starts with a fresh Python's"
    " dispositions, for its whole life",
    ("compute/runtime/fork_server.py", "_exit"): "a warm rank ending as killed by a signal: the default back just"
    " before it sends itself that signal",
    ("batchhost/agent.py", "act"): "the batch host ignores SIGTERM for the rest of its life once it asked Slurm to"
    " requeue the job: it waits to be ended",
    ("remote/serve.py", "run"): "the cluster-side runner ignores Ctrl-C and hang-up for the rest of its life, set"
    " after its child started so that the child does not inherit them",
}


def _signal_calls(path: Path) -> List[Tuple[str, int]]:
    """(enclosing function, line) of each ``signal.signal(...)`` call in a module."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            call = child.func if isinstance(child, ast.Call) else None
            if isinstance(call, ast.Attribute) and call.attr == "signal" and getattr(call.value, "id", "") == "signal":
                found.append((function, child.lineno))
            visit(child, name)

    visit(ast.parse(path.read_text(), str(path)), "<module>")
    return found


def test_no_module_but_the_relay_sets_a_handler_by_hand():
    """A handler installed by hand is one not put back when its block ends (an exception, a nested block, a caller
    in the same process): `handling` is the one way. What sets a disposition for a process's whole life says why in
    OWN_DISPOSITIONS."""
    calls = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module != RELAY:
            for function, line in _signal_calls(path):
                calls.setdefault((module, function), []).append(line)
    unlisted = sorted(f"{m}:{lines[0]} in {f}" for (m, f), lines in calls.items() if (m, f) not in OWN_DISPOSITIONS)
    assert not unlisted, (
        f"signal.signal outside {RELAY} (use handling for a block, or say why in OWN_DISPOSITIONS): {unlisted}"
    )
    stale = sorted(set(OWN_DISPOSITIONS) - set(calls))
    assert not stale, f"OWN_DISPOSITIONS lists places that no longer call signal.signal: {stale}"
