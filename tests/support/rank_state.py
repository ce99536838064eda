"""`python -m tests.support.rank_state OUT.json`: what a rank's process looks like from inside, written as JSON (the
fork server's child must look like a fresh process: tests/e2e/test_warm_ranks.py)."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from pathlib import Path

import numpy
import torch
import torch._dynamo  # noqa: F401  # as every training rank imports it (its first optimizer)
from threadpoolctl import threadpool_info


def _disposition(signum: int) -> str:
    handler = signal.getsignal(signum)
    return {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored", None: "foreign"}.get(
        handler, getattr(handler, "__name__", "handler")
    )


def _fds() -> dict:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return found


def state() -> dict:
    return {
        "argv": [sys.argv[0], *("OUT" if arg == sys.argv[-1] else arg for arg in sys.argv[1:])],
        "path0": sys.path[0],
        "cwd": os.getcwd(),
        "umask": os.umask(0o022),
        "environ": dict(os.environ),
        "signals": {
            signal.Signals(s).name: _disposition(s)
            for s in signal.valid_signals()
            if s in signal.Signals._value2member_map_
        },
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "fds": _fds(),
        "stdout": [sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding],
        "stderr": [sys.stderr.line_buffering, sys.stderr.write_through, sys.stderr.errors],
        "torch_threads": torch.get_num_threads(),
        "blas_threads": sorted(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"),
        "torch_seed": torch.initial_seed(),
        "torch_draw": torch.rand(3).tolist(),
        "main": __name__,
        "random": [random.random(), float(numpy.random.random())],
    }


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(state()))
