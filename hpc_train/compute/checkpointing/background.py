"""One checkpoint save, written in the foreground or by a background thread: what the trainer records of it.

A background save runs the write (serialize, hash, fsync, manifest, atomic install, rotation) in a daemon thread
of every rank that writes something. The thread only records its outcome; the main thread reads it at step
boundaries (the checkpointer's ``finished``), so an error is raised where the loop can stop cleanly. A daemon
thread dies with its process: a rank killed mid-write leaves a temporary file or directory, never a visible
checkpoint, and the next start removes it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

# When the run fails with a save in flight, the rank gives it this long to finish (it holds a consistent state,
# newer than the last installed checkpoint) before it exits; a sharded write whose other ranks are gone cannot.
FAILURE_WAIT_S = 60.0


@dataclass
class Ticket:
    """A save: its step and target, whether it is written in the background, the seconds the loop was blocked for
    it (staging, and any wait for it to finish), and, once done, its duration from start to the installed
    checkpoint."""

    step: int
    path: Path
    background: bool
    started: float  # time.perf_counter() when the save began
    blocked_s: float = 0.0
    total_s: Optional[float] = None


class BackgroundWrite:
    """Runs `write` in a daemon thread; remembers when it ended and the exception it raised, if any."""

    def __init__(self, ticket: Ticket, write: Callable[[], None]) -> None:
        self.ticket = ticket
        self.error: Optional[BaseException] = None
        self._write = write
        self._thread = threading.Thread(target=self._run, name=f"checkpoint-step-{ticket.step}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._write()
        except BaseException as err:  # reported by the main thread at its next step boundary
            self.error = err
        finally:
            self.ticket.total_s = time.perf_counter() - self.ticket.started

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Block until the write ends (at most `timeout_s`); whether it has."""
        self._thread.join(timeout_s)
        return self.done()
