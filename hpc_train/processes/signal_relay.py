"""Signals handled for the length of a block, and passed on to child processes: the one way hpc_train installs a
handler for a while (the batch host's agent and replica groups, the local launchers, Ctrl-C while queueing or while a
cluster's command is followed).

``handling(signals, handler)`` installs ``handler`` for each signal, runs the block and puts every previous handler
back, whatever ends the block (an exception, a ``KeyboardInterrupt`` raised by the handler itself). Blocks nest: each
restores what it found, so the inner one hands the outer one's handler back.

Only the main thread can install a handler (``signal.signal`` raises ``ValueError`` elsewhere), and Python runs every
handler in the main thread anyway. Called from another thread (the Python API in a worker thread, a notebook's
background job), ``handling`` installs nothing and the block runs with whatever the main thread has set: the work is
done, and a signal does what it would have done without hpc_train (the block yields False to say so).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from typing import Any, Callable, Iterable, Iterator, Union

Handler = Union[Callable[[int, Any], Any], int, signal.Handlers]

# Slurm's signals that the batch host passes on to the job's steps (srun passes them to every task).
RELAYED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGCONT)


@contextlib.contextmanager
def handling(signals: Iterable[int], handler: Handler) -> Iterator[bool]:
    """``handler`` for each of ``signals`` inside the block, the previous handlers back after it. Yields whether they
    were installed: False outside the main thread, where nothing is (see the module's words)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {}
    try:
        for signum in signals:
            previous[signum] = signal.signal(signum, handler)
        yield True
    finally:
        for signum, before in reversed(previous.items()):
            # None: a handler set outside Python, which cannot be put back; the default stands for it.
            signal.signal(signum, before if before is not None else signal.SIG_DFL)


def relay_to(processes: Iterable[subprocess.Popen]) -> Callable[[int, Any], None]:
    """A handler that passes the signal on to each of ``processes`` still running. The collection is read at each
    signal, so a list (or a dict's values) that grows after the handler is made is seen whole."""

    def relay(signum: int, _frame: Any) -> None:
        for process in list(processes):
            if process.poll() is None:
                process.send_signal(signum)

    return relay
