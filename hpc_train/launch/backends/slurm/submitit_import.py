"""submitit for the login side, imported on first use, its log lines said once.

submitit's logger has a handler on stdout and one on stderr and also hands each record to the root logger, where
Hydra puts one more: each of its warnings (its sacct warning on every poll, on a cluster without accounting) came out
three times. Here it gets one handler, on whatever ``sys.stderr`` is, for warnings and worse.
"""

from __future__ import annotations

import logging
import sys
from typing import Any


class _CurrentStderr(logging.StreamHandler):
    """A handler on whatever ``sys.stderr`` is when a record comes (a notebook or a test replaces it)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def submitit_module() -> Any:
    """submitit (~50 ms, imported here on first use), its logger with one handler (once per process)."""
    import submitit  # submitit (~50 ms): only to submit; a dry run renders the script without it

    logger = logging.getLogger("submitit")
    if not getattr(logger, "hpc_train_one_handler", False):
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        once = _CurrentStderr()
        once.setLevel(logging.WARNING)
        once.setFormatter(logging.Formatter("submitit %(levelname)s: %(message)s"))
        logger.addHandler(once)
        logger.propagate = False
        logger.hpc_train_one_handler = True  # type: ignore[attr-defined]
    return submitit
